#!/bin/bash
printf '#!/bin/bash\nsum=0; while read -r n; do sum=$((sum + n)); done < /app/ledger.txt; echo $sum\n' \
  > /app/total.sh
