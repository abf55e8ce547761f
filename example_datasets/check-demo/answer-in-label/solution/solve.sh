#!/bin/bash
/opt/derive.sh > /tmp/unlock.txt
