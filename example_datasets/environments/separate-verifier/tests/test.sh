#!/bin/bash
# Runs in a fresh sandbox: only /logs/artifacts and /app/report.txt were copied here.
ok=1
[ "$(cat /app/report.txt 2>/dev/null)" = "all checks passed" ] || { echo "report missing or wrong"; ok=0; }
grep -q '"checks": 3' /logs/artifacts/summary.json 2>/dev/null || { echo "summary missing"; ok=0; }
[ ! -e /app/draft.txt ] || { echo "the agent's scratch files should not be here"; ok=0; }
echo "$ok" > /logs/verifier/reward.txt
