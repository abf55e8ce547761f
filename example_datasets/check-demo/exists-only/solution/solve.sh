#!/bin/bash
ls /etc > /app/report.txt
