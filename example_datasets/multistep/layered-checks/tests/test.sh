#!/bin/bash
# The task's shared check; step 02-apply has no tests of its own and uses this one.
source /tests/lib.sh
echo "mode: $(config_mode), expected: ${EXPECTED_MODE}"
[ "$(config_mode)" = "$EXPECTED_MODE" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
