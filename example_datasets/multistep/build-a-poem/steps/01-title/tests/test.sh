#!/bin/bash
cat /poems/poem.txt
[ "$(head -n 1 /poems/poem.txt 2>/dev/null)" = "The Harbor at Dusk" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
