#!/bin/bash
echo 'apples 3' > /shop/stock.txt
