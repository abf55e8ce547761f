#!/bin/bash
echo '-- the keeper' >> poem.txt
