#!/bin/bash
# Two scores in reward.json: correctness (the output) and style (shebang, executable bit).
expected="1 2 Fizz 4 Buzz Fizz 7 8 Fizz Buzz 11 Fizz 13 14 FizzBuzz"
actual=$(bash /opt/fizzbuzz.sh 2>/dev/null | tr '\n' ' ' | sed 's/ $//')
correctness=0
[ "$actual" = "$expected" ] && correctness=1
style=0
if [ -x /opt/fizzbuzz.sh ] && head -n 1 /opt/fizzbuzz.sh | grep -q '^#!/bin/bash'; then
  style=1
fi
echo "correctness=${correctness} style=${style}"
printf '{"correctness": %d, "style": %d}\n' "$correctness" "$style" > /logs/verifier/reward.json
