#!/usr/bin/env bash
# Starts dapod on its embedded default (loopback, preset models, ./var), after installing missing
# Debian packages and building. Extra arguments are passed to dapod.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
exec build/server/dapod "$@"
