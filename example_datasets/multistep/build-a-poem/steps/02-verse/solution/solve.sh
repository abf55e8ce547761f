#!/bin/bash
echo 'Boats sleep under lantern light' >> poem.txt
