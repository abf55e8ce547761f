#!/bin/bash
if [ "$(cat /shop/prices.txt 2>/dev/null)" = 'apples 2' ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
