#!/bin/bash
# Runs in /work after this folder was copied there, before the agent starts.
set -eu
name=$(tr -d '[:space:]' < name.txt)
printf '%s\n' "$name" > name.txt
echo "setup.sh trimmed name.txt to '$name'" > /logs/artifacts/setup-ran.txt
