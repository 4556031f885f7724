# Sourced by the tests that keep a README section true (test_quickstart.sh,
# test_agents_quickstart.sh): takes the shell blocks between `<!-- NAME:begin -->` and
# `<!-- NAME:end -->` of README.md, starts dapod on a free loopback port with a scratch data
# directory, replaces only the daemon's base URL (http://127.0.0.1:8080) and the ports the
# caller names, and runs the commands with bash -e -o pipefail in a scratch folder that sees the
# repository's tests/, examples/ and clients/.
# The caller sets `test` (its name, for messages) and calls, in order:
#   readme_init             exits 77 (skipped) when curl or python3 is missing; sets root, tmp
#   readme_extract NAME     the block into $tmp/readme.sh
#   readme_serve DAPOD      the daemon; sets url, pid
#   readme_run LIMIT_S [PORT...]  each PORT replaced by a free one; stdout in $tmp/out.txt
#   readme_stop             SIGTERM to the daemon; fails unless it exits 0
# and fail MESSAGE on its own failures (prints the daemon log's end).

readme_init() {
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  default_url=http://127.0.0.1:8080
  for tool in curl python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "$test: $tool not found; skipping" >&2
      exit 77
    fi
  done
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/dapod-$test.XXXXXX")
  pid=
  trap readme_cleanup EXIT
  trap 'exit 1' INT TERM HUP # the EXIT trap then stops the daemon
}

readme_cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  # what the commands started in the background (a tool server) goes with their process group
  if [ -f "$tmp/pgid" ]; then kill -KILL -- "-$(cat "$tmp/pgid")" 2>/dev/null || true; fi
  rm -rf "$tmp"
}

fail() {
  echo "$test: FAIL: $*" >&2
  if [ -f "$tmp/dapod.log" ]; then
    echo "--- dapod log (end) ---" >&2
    tail -n 40 "$tmp/dapod.log" >&2
  fi
  exit 1
}

# (only ```sh / ```bash blocks run: a block of example output in between would not)
readme_extract() {
  awk -v name="$1" '$0 == "<!-- " name ":begin -->" { on = 1; next }
       $0 == "<!-- " name ":end -->" { on = 0 }
       on && /^```/ { if (fence) fence = 0; else { fence = 1; run = ($0 ~ /^```(sh|bash)[ \t]*$/) } next }
       on && fence && run { print }' "$root/README.md" >"$tmp/readme.sh"
  [ -s "$tmp/readme.sh" ] || fail "no shell block between the $1 markers of README.md"
  grep -q "$default_url" "$tmp/readme.sh" || fail "the $1 block never names $default_url"
}

readme_serve() {
  mkdir -p "$tmp/models" "$tmp/work"
  # the log exists before the first poll reads it: the background job opens its redirection
  # after the fork, and under a loaded machine the poll below (set -e, pipefail) once read
  # before it did, failing the test in 0.04 s
  : >"$tmp/dapod.log"
  "$1" serve --listen 127.0.0.1:0 --data-dir "$tmp/var" --models-dir "$tmp/models" \
    --workers 1 2>"$tmp/dapod.log" &
  pid=$!
  url=
  for _ in $(seq 600); do # 60 s at most (the sanitizer build starts slower)
    url=$(sed -n 's/^dapod: listening on \(http:\/\/[^ ]*\)$/\1/p' "$tmp/dapod.log" | head -n 1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || fail "dapod exited before listening"
    sleep 0.1
  done
  [ -n "$url" ] || fail "dapod did not report its port within 60 s"
  for _ in $(seq 600); do
    curl -sf "$url/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf "$url/readyz" >/dev/null || fail "dapod at $url is not ready"
}

# A free loopback port: bound, read and released by the kernel's choice.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

readme_run() {
  local limit=$1
  shift
  cp "$tmp/readme.sh" "$tmp/work/readme.sh.in"
  sed -i "s#$default_url#$url#g" "$tmp/work/readme.sh.in"
  for port in "$@"; do
    grep -q "$port" "$tmp/work/readme.sh.in" || fail "the block never names port $port"
    sed -i "s#\\b$port\\b#$(free_port)#g" "$tmp/work/readme.sh.in"
  done
  mv "$tmp/work/readme.sh.in" "$tmp/work/readme.sh"
  if grep -q "$default_url" "$tmp/work/readme.sh"; then fail "substitution left $default_url"; fi
  for d in tests examples clients; do
    [ -d "$root/$d" ] && ln -s "$root/$d" "$tmp/work/$d"
  done
  echo "$test: running the README's commands against $url" >&2
  local start
  start=$(date +%s)
  # its own process group, so that what it leaves running can be stopped
  if ! (cd "$tmp/work" && exec setsid bash -c 'echo $$ >../pgid; exec timeout '"$limit"' bash -e -o pipefail readme.sh' \
    >"$tmp/out.txt" 2>"$tmp/err.txt"); then
    cat "$tmp/out.txt" "$tmp/err.txt" >&2
    fail "the README's commands failed"
  fi
  echo "$test: the commands ran in $(($(date +%s) - start)) s" >&2
}

readme_stop() {
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  pid=
  [ "$rc" -eq 0 ] || fail "dapod exited $rc after SIGTERM"
}
