#!/usr/bin/env bash
# The layers point one way: core <- server <- api <- main, and inside core/ its parts
#   base <- text <- engine <- rl,   base <- reward <- rl   (reward may use text)
# (ARCHITECTURE.md, core/README.md). Two checks of each:
# 1. By name: no file of a layer or part includes a header that lives only in one it may not
#    use, none reaches around with a path ("../x.h", "engine/x.h"), a part's internal headers
#    ("/* Internal...") are included in that part (and its tests) only, and no header name is in
#    two parts. Only main/ sees all.
# 2. By the compiler, with the include folders CMake gives each library: a probe that includes
#    a header of every layer or part it may use compiles, and a probe that includes one header of
#    a layer or part it may not use fails, naming that header (so the first kind of probe fails
#    for the right reason, and the second cannot pass by accident).
# Usage: check.sh SOURCE_DIR CC NAME=DIR:DIR... for each of base text engine reward rl server
# (each library's include folders, ':'-separated).
set -uo pipefail
src=$1 cc=$2
shift 2
declare -A inc
for a in "$@"; do inc[${a%%=*}]=${a#*=}; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0 checks=0

# What each part may use, and the header its probes include.
parts=(base text engine reward rl)
declare -A may=([base]="base" [text]="base text" [engine]="base text engine"
  [reward]="base text reward" [rl]="base text engine reward rl")
declare -A probe_h=([base]=error.h [text]=tokenizer.h [engine]=model.h [reward]=judge.h
  [rl]=runner.h [server]=store.h [api]=http.h)

# The headers of a folder as an alternation for grep -E ("a\.h|b\.h").
headers() { (cd "$1" && ls -- *.h 2>/dev/null) | sed 's/\./\\./g' | paste -sd'|'; }
# Reports the lines of files that include one of the headers of pattern $2 (by bare name).
includes_of() { local pat=$1; shift; [ -n "$pat" ] && grep -nE "#include \"($pat)\"" "$@"; }
bad() { echo "$1"; echo "$2"; fail=1; }

# ---- 1. by name ----
for p in "${parts[@]}"; do
  [ -d "$src/core/$p" ] || bad "core/$p: missing" ""
done
if ls "$src"/core/*.[ch] >/dev/null 2>&1; then
  bad "core/ has source files at its top (each belongs to a part's folder):" "$(ls "$src"/core/*.[ch])"
fi
core_files=$(find "$src/core" -name '*.[ch]')
daemon=$(headers "$src/server")"|"$(headers "$src/api")
checks=$((checks + 1))
out=$(includes_of "$daemon" $core_files)
[ -z "$out" ] || bad "core/ includes a daemon header:" "$out"
checks=$((checks + 1))
out=$(includes_of "$(headers "$src/api")" "$src"/server/*.[ch])
[ -z "$out" ] || bad "server/ includes an api/ header:" "$out"
checks=$((checks + 1))
out=$(grep -nE '#include "[^"]*/' $core_files "$src"/server/*.[ch] "$src"/api/*.[ch])
[ -z "$out" ] || bad "an include reaches around with a path:" "$out"
for p in "${parts[@]}"; do
  for q in "${parts[@]}"; do
    case " ${may[$p]} " in *" $q "*) continue ;; esac
    checks=$((checks + 1))
    out=$(includes_of "$(headers "$src/core/$q")" "$src/core/$p"/*.[ch])
    [ -z "$out" ] || bad "core/$p includes a header of core/$q, which it may not use:" "$out"
  done
done
# a part's internal headers (the ones that say so on their first line) are included inside
# the part only, and by its own tests
for h in $(cd "$src/core" && grep -l '^/\* Internal' */*.h); do
  p=${h%%/*} n=${h#*/}
  checks=$((checks + 1))
  out=$(grep -rnE "#include \"$n\"" "$src"/core "$src"/server "$src"/api "$src"/main "$src"/tests \
    --include='*.[ch]' | grep -vE "^$src/(core|tests)/$p/|^$src/tests/fuzz/")
  [ -z "$out" ] || bad "$h is internal to core/$p, but is included outside it:" "$out"
done
# a header name in two parts would make the by-name check (and the reader) guess
checks=$((checks + 1))
out=$(cd "$src/core" && ls -- */*.h | xargs -n1 basename | sort | uniq -d)
[ -z "$out" ] || bad "header names found in more than one part of core/:" "$out"

# ---- 2. by the compiler ----
cflags=$(pkg-config --cflags jansson nettle libpcre2-8 libcurl sqlite3 2>/dev/null)
# compile NAME FOLDERS HEADER...: 0 when a file including the headers compiles with -I FOLDERS
compile() {
  local name=$1 dirs=$2 flags=() h d
  shift 2
  IFS=: read -ra d <<<"$dirs"
  for h in "${d[@]}"; do flags+=("-I$h"); done
  : >"$tmp/$name.c"
  for h in "$@"; do printf '#include "%s"\n' "$h" >>"$tmp/$name.c"; done
  printf 'int probe;\n' >>"$tmp/$name.c"
  # shellcheck disable=SC2086
  "$cc" -std=c11 -D_GNU_SOURCE -fsyntax-only "${flags[@]}" $cflags "$tmp/$name.c" 2>"$tmp/$name.err"
}
# probe LIBRARY ALLOWED... -- FORBIDDEN...
probe() {
  local lib=$1 h ok=() q
  shift
  [ -n "${inc[$lib]:-}" ] || { bad "probe: no include folders given for $lib" ""; return; }
  while [ "$1" != "--" ]; do ok+=("${probe_h[$1]}"); shift; done
  shift
  checks=$((checks + 1))
  if ! compile "$lib-ok" "${inc[$lib]}" "${ok[@]}"; then
    bad "probe: $lib's own headers and those it may use (${ok[*]}) do not compile with its include folders:" "$(cat "$tmp/$lib-ok.err")"
  fi
  for q in "$@"; do
    h=${probe_h[$q]}
    checks=$((checks + 1))
    if compile "$lib-$q" "${inc[$lib]}" "${probe_h[$lib]}" "$h"; then
      bad "probe: a $lib file including $q's $h compiled: the direction is not enforced" ""
    elif ! grep -q "$h" "$tmp/$lib-$q.err"; then
      bad "probe: $lib including $q's $h failed for another reason:" "$(cat "$tmp/$lib-$q.err")"
    else
      echo "$lib -> $q fails as it should: $(grep -m1 "$h" "$tmp/$lib-$q.err" | sed "s|$tmp/||")"
    fi
  done
}
probe base base -- text engine reward rl server api
probe text base text -- engine reward rl server api
probe engine base text engine -- reward rl server api
probe reward base text reward -- engine rl server api
probe rl base text engine reward rl -- server api
probe server base text engine reward rl server -- api

if [ "$fail" -eq 0 ]; then
  echo "$checks passed, 0 failed"
else
  echo "layering: some of $checks checks failed (above)"
fi
exit "$fail"
