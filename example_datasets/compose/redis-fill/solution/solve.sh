#!/bin/bash
# No redis-cli in the image: the Redis protocol through bash's /dev/tcp.
set -euo pipefail
exec 3<>/dev/tcp/db/6379
command() {
  local out="*$#\r\n" word
  for word in "$@"; do out+="\$${#word}\r\n${word}\r\n"; done
  printf "$out" >&3
  read -r reply <&3
  echo "$* -> $reply"
}
command SET fruit:1 apple
command SET fruit:2 banana
command SET fruit:count 2
