#!/bin/bash
echo 'apples 2' > /shop/prices.txt
