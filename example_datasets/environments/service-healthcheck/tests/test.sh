#!/bin/bash
# The answer must be the service's, so the service must have been running.
answer=$(cat /app/answer.txt 2>/dev/null)
echo "answer: '${answer}'"
if [ "$answer" = "HELLO, HARBOR" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
