#!/bin/bash
source /tests/lib.sh
# EXPECTED comes from [steps.verifier.env].
[ "$(greeting)" = "$EXPECTED" ] || score 0
# A script that reads the file, not one that prints the name it saw.
echo Ada > /work/name.txt
[ "$(greeting)" = "Hello, Ada!" ] && { echo Harbor > /work/name.txt; score 1; }
score 0.5
