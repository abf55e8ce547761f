#!/bin/bash
set -euo pipefail
total=0
while read -r number; do
  total=$((total + number))
done < data/numbers.txt
echo "$total" > sum.txt
