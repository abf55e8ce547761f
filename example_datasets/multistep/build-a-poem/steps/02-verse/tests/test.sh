#!/bin/bash
# The title from step 1 must still be there: this step builds on it.
cat /poems/poem.txt
if [ "$(sed -n 1p /poems/poem.txt)" = "The Harbor at Dusk" ] \
   && [ "$(sed -n 2p /poems/poem.txt)" = "Boats sleep under lantern light" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
