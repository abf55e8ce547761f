#!/bin/bash
echo Paris > /app/answer.txt
