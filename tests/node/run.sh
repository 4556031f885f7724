#!/bin/sh
# Reference check of chartok's tokenizer.json (CTest label node): installs the Hugging Face
# `tokenizers` library for Node (tests/node/package.json, pinned) into a folder under the BUILD
# dir, has chartok_dump write tokenizer.json files and cases, and replays them through the
# reference with chartok_ref.mjs. Exit 77 (skipped) when node/npm or the package is unavailable.
# Usage: run.sh CHARTOK_DUMP WORKDIR
set -eu
dump=$1
work=$2
src=$(cd "$(dirname "$0")" && pwd)

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "run.sh: $tool not found; skipping the reference tokenizer check" >&2
    exit 77
  fi
done

mkdir -p "$work/data"
cp "$src/package.json" "$src/chartok_ref.mjs" "$work/"
if [ -f "$src/package-lock.json" ]; then cp "$src/package-lock.json" "$work/"; fi

pkg="$work/node_modules/@anush008/tokenizers/package.json"
want=$(node -e 'console.log(require(process.argv[1]).dependencies["@anush008/tokenizers"])' \
  "$work/package.json")
have=$(node -e 'try { console.log(require(process.argv[1]).version) } catch { console.log("") }' \
  "$pkg")
if [ "$have" != "$want" ]; then
  if ! (cd "$work" && npm install --no-audit --no-fund >&2); then
    echo "run.sh: npm install of @anush008/tokenizers@$want failed (offline?); skipping" >&2
    exit 77
  fi
fi
if ! (cd "$work" && node -e 'require("@anush008/tokenizers").Tokenizer') >/dev/null; then
  echo "run.sh: @anush008/tokenizers does not load on this platform; skipping" >&2
  exit 77
fi

rm -f "$work"/data/*
"$dump" "$work/data"
exec node "$work/chartok_ref.mjs" "$work/data"
