#!/usr/bin/env bash
# The layers point one way: core <- server <- api <- main (ARCHITECTURE.md). Two checks:
# 1. By name: no core/ file includes a server/ or api/ header, no server/ file includes an api/
#    header, and none reaches around with a path. Only main/ (the composition root) sees all.
# 2. By the compiler, with the include folders CMake gives each library: a server/ file that
#    includes an api/ header does not compile, while its own and core's headers do (so the
#    first probe fails for the right reason).
# Usage: check.sh SOURCE_DIR CC -I... (the -I flags of the dapod_server library)
set -uo pipefail
src=$1 cc=$2
shift 2
fail=0
headers() { (cd "$src/$1" && ls -- *.h) | sed 's/\./\\./g' | paste -sd'|'; }
api_h=$(headers api) server_h=$(headers server)

bad=$(grep -nE "#include \"($api_h|$server_h)\"|#include \"\.\./" "$src"/core/*.[ch])
[ -z "$bad" ] || { echo "core/ includes a daemon header:"; echo "$bad"; fail=1; }
bad=$(grep -nE "#include \"($api_h)\"|#include \"\.\./|#include \"api/" "$src"/server/*.[ch])
[ -z "$bad" ] || { echo "server/ includes an api/ header:"; echo "$bad"; fail=1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include "store.h"\n#include "registry.h"\n#include "runner.h"\nint probe;\n' >"$tmp/ok.c"
printf '#include "store.h"\n#include "http.h"\nint probe;\n' >"$tmp/wrong.c"
if ! "$cc" -std=c11 -D_GNU_SOURCE -fsyntax-only "$@" $(pkg-config --cflags jansson sqlite3) \
  "$tmp/ok.c" 2>"$tmp/ok.err"; then
  echo "probe: server's own and core's headers do not compile with its include folders:"
  cat "$tmp/ok.err"
  fail=1
fi
if "$cc" -std=c11 -D_GNU_SOURCE -fsyntax-only "$@" "$tmp/wrong.c" 2>"$tmp/wrong.err"; then
  echo "probe: a server/ file including api/'s http.h compiled: the layering is not enforced"
  fail=1
elif ! grep -q "http.h" "$tmp/wrong.err"; then
  echo "probe: the wrong-way include failed for another reason:"
  cat "$tmp/wrong.err"
  fail=1
else
  echo "a wrong-way include fails as it should: $(grep -m1 'http.h' "$tmp/wrong.err")"
fi
[ "$fail" -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit "$fail"
