#!/bin/bash
# test.sh also runs from the working directory, with [verifier].env set.
echo "working directory: $PWD"
if [ "$PWD" = /workspace/project ] && [ "$(cat greeting.txt 2>/dev/null)" = "$EXPECTED_GREETING" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "greeting.txt is missing or does not say: $EXPECTED_GREETING"
  echo 0 > /logs/verifier/reward.txt
fi
