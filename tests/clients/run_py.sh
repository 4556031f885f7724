#!/bin/sh
# Runs a Python test under Debian's /usr/bin/python3; 77 (skipped) when it is missing.
[ -x /usr/bin/python3 ] || { echo "/usr/bin/python3 missing: skipped"; exit 77; }
exec /usr/bin/python3 "$@"
