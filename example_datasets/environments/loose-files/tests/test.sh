#!/bin/bash
# The numbers arrived with the task's environment/ folder, in the working directory.
expected=0
while read -r number; do expected=$((expected + number)); done < /workspace/data/numbers.txt
actual=$(tr -d '[:space:]' < /workspace/sum.txt 2>/dev/null)
echo "expected ${expected}, found '${actual}'"
if [ "$actual" = "$expected" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
