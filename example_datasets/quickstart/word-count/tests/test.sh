#!/bin/bash
expected=$(wc -w < /data/poem.txt | tr -d ' ')
actual=$(tr -d '[:space:]' < /data/count.txt 2>/dev/null)
echo "expected ${expected}, found '${actual}'"
if [ "$actual" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
