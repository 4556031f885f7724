#!/bin/sh
# `cmake --install` (label clients): installs the build into a scratch prefix and checks that
# the daemon, dapoctl, the C judge, the Python client, the judges, the CI example and the systemd
# files land where clients/README.md and systemd/README.md say, with the unit's ExecStart and
# the tmpfiles copy source rewritten to the prefix. Usage: test_install.sh BUILD_DIR
set -eu
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
p="$tmp/prefix"
cmake --install "$build" --prefix "$p" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
fail=0
for f in bin/dapod bin/dapoctl bin/dapod-c-judge share/dapod/judges/math_judge.py; do
  [ -x "$p/$f" ] || { echo "missing or not executable: $f"; fail=1; }
done
for f in share/dapod/python/dapod_client.py share/dapod/dapod.example.json \
         lib/systemd/system/dapod.service lib/sysusers.d/dapod.conf lib/tmpfiles.d/dapod.conf \
         share/doc/dapod/clients/README.md share/doc/dapod/clients/dapoctl.md \
         share/doc/dapod/ci/github-actions.yml share/doc/dapod/ci/dapod-ci.sh; do
  [ -f "$p/$f" ] || { echo "missing: $f"; fail=1; }
done
[ $fail -eq 0 ] || { cat "$tmp/install.log"; exit 1; }
grep -qx "ExecStart=$p/bin/dapod serve --config /etc/dapod/dapod.json --data-dir \${STATE_DIRECTORY} --models-dir \${STATE_DIRECTORY}/models" \
  "$p/lib/systemd/system/dapod.service" || { grep ExecStart "$p/lib/systemd/system/dapod.service"; exit 1; }
grep -q "^C /etc/dapod/dapod.json .* $p/share/dapod/dapod.example.json\$" "$p/lib/tmpfiles.d/dapod.conf" \
  || { cat "$p/lib/tmpfiles.d/dapod.conf"; exit 1; }
"$p/bin/dapoctl" --version | grep -q '^dapoctl [0-9]'
/usr/bin/python3 -c "import sys; sys.path.insert(0, '$p/share/dapod/python'); import dapod_client; dapod_client.Client('http://127.0.0.1:1')" 
cmp "$p/share/dapod/dapod.example.json" "$(dirname "$0")/../../systemd/dapod.example.json"
if command -v systemd-analyze >/dev/null 2>&1; then
  out=$(systemd-analyze verify --man=no "$p/lib/systemd/system/dapod.service" 2>&1) || { echo "$out"; exit 1; }
  [ -z "$out" ] || { echo "$out"; exit 1; }
fi
echo "installed into $p: ok"
