#!/bin/bash
grep -c ERROR /app/service.log > /app/errors.txt
