#!/bin/bash
wc -w < /usr/share/common-licenses/Apache-2.0 | tr -d ' ' > /app/count.txt
