#!/bin/bash
# Asks the service itself and compares with what the agent wrote.
exec 3<>/dev/tcp/api/8080
printf 'GET /token HTTP/1.0\r\nHost: api\r\n\r\n' >&3
expected=$(sed '1,/^\r$/d' <&3)
if [ -n "$expected" ] && [ "$(cat /app/token.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "expected token $expected, found: $(cat /app/token.txt 2>/dev/null)"
  echo 0 > /logs/verifier/reward.txt
fi
