#!/bin/bash
if [ "$(/app/total.sh)" = "12" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
