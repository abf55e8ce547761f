#!/bin/bash
# Reward 1 when /tmp/answer.txt holds "42".
if [ "$(cat /tmp/answer.txt 2>/dev/null)" = "42" ]; then
  echo "the answer is right"
  echo 1 > /logs/verifier/reward.txt
else
  echo "the answer is missing or wrong"
  echo 0 > /logs/verifier/reward.txt
fi
