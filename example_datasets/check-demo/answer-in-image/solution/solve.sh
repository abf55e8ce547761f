#!/bin/bash
echo correct-horse-battery-staple-7731 > /tmp/passphrase.txt
