#!/bin/bash
# Layered over the task's tests/: this file wins, lib.sh comes from the shared folder.
source /tests/lib.sh
echo "mode: $(config_mode)"
[ "$(config_mode)" = draft ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
