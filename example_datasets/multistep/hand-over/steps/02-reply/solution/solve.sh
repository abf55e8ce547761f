#!/bin/bash
grep -q moorings notes.txt && echo 'moorings checked' > reply.txt
