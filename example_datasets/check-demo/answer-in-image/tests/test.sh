#!/bin/bash
expected='correct-horse-battery-staple-7731'
if [ "$(cat /tmp/passphrase.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
