#!/bin/bash
if [ "$(/app/count.sh)" = "10" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
