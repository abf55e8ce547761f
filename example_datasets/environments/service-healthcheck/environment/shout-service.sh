#!/bin/sh
# A tiny service: for every file NAME.req in the inbox it writes NAME.resp to the
# outbox, holding the request in capitals. It says it is ready after a second.
inbox=$1
outbox=$2
mkdir -p /run/shout "$inbox" "$outbox"
sleep 1
touch /run/shout/ready
while :; do
  for request in "$inbox"/*.req; do
    [ -e "$request" ] || continue
    name=$(basename "$request" .req)
    tr '[:lower:]' '[:upper:]' < "$request" > "$outbox/$name.resp.tmp"
    mv "$outbox/$name.resp.tmp" "$outbox/$name.resp"
    rm -f "$request"
  done
  sleep 0.1
done
