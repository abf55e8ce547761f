#!/bin/bash
set -euo pipefail
# solve.sh runs from [environment].workdir, with [solution].env set.
echo "$GREETING" > greeting.txt
