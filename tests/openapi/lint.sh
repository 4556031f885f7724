#!/bin/sh
# Lints openapi.yaml with Redocly CLI (pinned in tests/openapi/package-lock.json, installed under
# the build dir by install.sh): the recommended ruleset with warnings as errors
# (tests/openapi/redocly.yaml; reviewed exceptions in .redocly.lint-ignore.yaml).
# Exit 77 (skipped) when node or npm is missing. Usage: lint.sh WORKDIR
set -eu
work=$1
src=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src/../.." && pwd)
rc=0
sh "$src/install.sh" "$work" || rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true NO_COLOR=1
exec "$work/node_modules/.bin/redocly" lint --config "$src/redocly.yaml" --format=stylish \
  "$root/openapi.yaml"
