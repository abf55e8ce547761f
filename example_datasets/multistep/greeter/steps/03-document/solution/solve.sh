#!/bin/bash
printf '# greet.sh\n\nPrints a greeting for the name in name.txt.\n' > /work/README.md
