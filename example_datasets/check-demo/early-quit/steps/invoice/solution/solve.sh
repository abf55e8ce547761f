#!/bin/bash
echo 6 > /shop/invoice.txt
