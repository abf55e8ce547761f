#!/bin/bash
# pytest-harbor: runs the task's Python verifier with a Python of 3.8 or newer, from the
# working directory (the verifier's `workspace`); anything older is refused, naming it.
found=""
for candidate in python3 python; do
  path=$(command -v "$candidate") || continue
  if "$path" -I -c 'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)' 2>/dev/null; then
    exec "$path" -I /tests/.harbor/run_verifier.py "$PWD"
  fi
  version=$("$path" -c 'import sys; print(".".join(str(n) for n in sys.version_info[:3]))' 2>/dev/null)
  [ -n "$found" ] || found="$candidate $version"
done
if [ -n "$found" ]; then
  message="the Python verifier needs Python 3.8 or newer; the image has $found"
else
  message="the Python verifier needs Python 3.8 or newer; the image has no python3"
fi
echo "$message" > /logs/verifier/contract-error.txt
echo "$message" >&2
exit 127
