#!/bin/bash
source /tests/lib.sh
grep -qx '# greet.sh' /work/README.md && grep -q 'name.txt' /work/README.md || score 0
# What step 2 built still works.
[ "$(greeting)" = "Hello, Harbor!" ] && score 1
score 0
