#!/bin/bash
if [ "$(cat /shop/stock.txt 2>/dev/null)" = 'apples 3' ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
