#!/bin/bash
exec 3<>/dev/tcp/db/6379
get() {
  printf '*2\r\n$3\r\nGET\r\n$%s\r\n%s\r\n' "${#1}" "$1" >&3
  local header value
  read -r header <&3
  if [ "${header%$'\r'}" = '$-1' ]; then echo "(missing)"; return; fi
  read -r value <&3
  echo "${value%$'\r'}"
}
found="$(get fruit:1) $(get fruit:2) $(get fruit:count)"
echo "found: $found"
if [ "$found" = "apple banana 2" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
