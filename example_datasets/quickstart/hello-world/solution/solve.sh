#!/bin/bash
set -euo pipefail
echo 'Hello, world!' > /tmp/hello.txt
