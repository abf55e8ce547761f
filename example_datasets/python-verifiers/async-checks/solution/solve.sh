#!/bin/bash
printf '#!/bin/sh\necho "Hello, Harbor!"\n' > /app/hello.sh
chmod +x /app/hello.sh
