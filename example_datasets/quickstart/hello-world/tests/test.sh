#!/bin/bash
# Reward 1 when /tmp/hello.txt holds exactly "Hello, world!".
if [ "$(cat /tmp/hello.txt 2>/dev/null)" = "Hello, world!" ]; then
  echo "hello.txt is right"
  echo 1 > /logs/verifier/reward.txt
else
  echo "hello.txt is missing or wrong"
  echo 0 > /logs/verifier/reward.txt
fi
