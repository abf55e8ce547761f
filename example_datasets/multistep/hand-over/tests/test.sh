#!/bin/bash
# One verifier for both steps; it runs as the image's user (root), whoever the agent was.
echo "notes: $(cat /desk/notes.txt 2>/dev/null)"
if [ -f /desk/reply.txt ]; then
  # Step 2: written by nobody, who owns the working directory for that step.
  owner=$(stat -c %U /desk/reply.txt)
  echo "reply by ${owner}: $(cat /desk/reply.txt)"
  if [ "$owner" = nobody ] && [ "$(cat /desk/reply.txt)" = "moorings checked" ]; then
    echo 1 > /logs/verifier/reward.txt
  else
    echo 0 > /logs/verifier/reward.txt
  fi
elif [ "$(cat /desk/notes.txt 2>/dev/null)" = "check the moorings" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
