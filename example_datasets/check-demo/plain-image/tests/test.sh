#!/bin/bash
# Reward 1 when count.json says 3 lines (spaces aside).
if [ "$(tr -d ' \n' < /srv/notes/count.json 2>/dev/null)" = '{"lines":3}' ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
