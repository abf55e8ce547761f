#!/bin/bash
if [ "$(tr -d '[:space:]' < /app/errors.txt 2>/dev/null)" = "9" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
