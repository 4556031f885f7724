#!/bin/sh
# Installs the pinned npm packages of tests/openapi/package-lock.json (Redocly CLI, Ajv,
# ajv-formats, yaml) into WORKDIR with tests/npm_ci.sh and copies validate.mjs beside them.
# Exit 77 (skipped) when node or npm is missing; 1 when the install fails.
# Usage: install.sh WORKDIR
set -eu
src=$(cd "$(dirname "$0")" && pwd)
exec sh "$src/../npm_ci.sh" "$src" "$1" validate.mjs
