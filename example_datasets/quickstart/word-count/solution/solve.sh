#!/bin/bash
set -euo pipefail
wc -w < /data/poem.txt | tr -d ' ' > /data/count.txt
