#!/bin/bash
# Broken on purpose: writes the wrong number.
echo 41 > /tmp/answer.txt
