#!/bin/bash
set -euo pipefail
mkdir -p /app
echo 'all checks passed' > /app/report.txt
echo '{"checks": 3}' > /logs/artifacts/summary.json
# Scratch work: not an artifact, so the verifier never sees it.
echo 'draft' > /app/draft.txt
