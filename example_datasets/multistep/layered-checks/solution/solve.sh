#!/bin/bash
# The task's own solution: step 02-apply has no solution/ folder and falls back to it.
sed -i 's/^mode=.*/mode=applied/' /etc/harbor/app.conf
