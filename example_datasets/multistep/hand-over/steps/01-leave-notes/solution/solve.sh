#!/bin/bash
echo 'check the moorings' > notes.txt
