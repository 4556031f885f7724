#!/bin/sh
# Reference check of chartok's tokenizer.json (CTest label node): installs the Hugging Face
# `tokenizers` library for Node (tests/text/chartok_ref/package-lock.json, pinned) into a folder under the
# BUILD dir with tests/npm_ci.sh, has chartok_dump write tokenizer.json files and cases, and
# replays them through the reference with chartok_ref.mjs. Exit 77 (skipped) when node/npm or the
# package is unavailable.
# Usage: run.sh CHARTOK_DUMP WORKDIR
set -eu
dump=$1
work=$2
src=$(cd "$(dirname "$0")" && pwd)

rc=0
sh "$src/../../npm_ci.sh" "$src" "$work" chartok_ref.mjs || rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 77 ] || echo "run.sh: installing @anush008/tokenizers failed (offline?); skipping" >&2
  exit 77
fi
if ! (cd "$work" && node -e 'require("@anush008/tokenizers").Tokenizer') >/dev/null; then
  echo "run.sh: @anush008/tokenizers does not load on this platform; skipping" >&2
  exit 77
fi

mkdir -p "$work/data"
rm -f "$work"/data/*
"$dump" "$work/data"
exec node "$work/chartok_ref.mjs" "$work/data"
