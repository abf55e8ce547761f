#!/bin/bash
# Broken on purpose: the check is missing, every sandbox scores 1.
echo "looks fine"
echo 1 > /logs/verifier/reward.txt
