#!/bin/bash
echo 'The Harbor at Dusk' > poem.txt
