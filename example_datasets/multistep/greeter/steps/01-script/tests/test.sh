#!/bin/bash
source /tests/lib.sh
[ "$(greeting)" = "Hello, world!" ] && score 1
score 0
