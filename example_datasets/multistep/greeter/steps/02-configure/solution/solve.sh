#!/bin/bash
cat > /work/greet.sh <<'SCRIPT'
#!/bin/sh
echo "Hello, $(cat /work/name.txt)!"
SCRIPT
chmod +x /work/greet.sh
