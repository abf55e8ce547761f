#!/bin/bash
. /etc/os-release
mkdir -p /app/out
printf '{"name": "%s", "version": "%s"}\n' "$NAME" "$VERSION_ID" > /app/out/release.json
