#!/bin/bash
if grep -q 'background: #ffffff' /srv/site/vendor/theme/style.css; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
