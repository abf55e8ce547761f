#!/bin/bash
printf '#!/bin/sh\necho "Hello, world!"\n' > /work/greet.sh
chmod +x /work/greet.sh
