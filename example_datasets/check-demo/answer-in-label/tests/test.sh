#!/bin/bash
if [ "$(cat /tmp/unlock.txt 2>/dev/null)" = "QX5-harbor-2291-delta" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
