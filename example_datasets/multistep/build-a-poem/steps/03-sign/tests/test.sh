#!/bin/bash
cat /poems/poem.txt
lines=$(wc -l < /poems/poem.txt)
if [ "$lines" -eq 3 ] && [ "$(tail -n 1 /poems/poem.txt)" = "-- the keeper" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
