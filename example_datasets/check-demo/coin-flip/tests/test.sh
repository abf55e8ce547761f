#!/bin/bash
# Broken on purpose: the reward depends on chance, not on the answer.
if [ "$(cat /tmp/answer.txt 2>/dev/null)" = "42" ] && [ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
