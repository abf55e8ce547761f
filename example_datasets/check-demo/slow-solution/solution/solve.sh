#!/bin/bash
# Takes 3 of its 5 seconds: a busier machine makes it time out.
sleep 3
echo 42 > /tmp/answer.txt
