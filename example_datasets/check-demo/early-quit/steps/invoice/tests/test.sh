#!/bin/bash
if [ "$(cat /shop/invoice.txt 2>/dev/null)" = 6 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
