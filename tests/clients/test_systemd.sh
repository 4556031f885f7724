#!/bin/sh
# The systemd unit (label clients): `systemd-analyze verify` on a copy of systemd/dapod.service
# whose ExecStart names the built dapod must print nothing (it exits 0 even on unknown keys, so
# any output fails the test); `systemd-analyze security --offline` must rate the hardening at
# most 2.0 ("OK"); the sysusers and tmpfiles snippets must parse (systemd-sysusers/-tmpfiles
# --dry-run against a scratch root). Skipped (77) only without systemd-analyze.
# Usage: test_systemd.sh SOURCE_DIR DAPOD
set -eu
src=$1
dapod=$2
command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd-analyze missing: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -q '^ExecStart=/usr/bin/dapod serve ' "$src/systemd/dapod.service"
sed "s#^ExecStart=/usr/bin/dapod #ExecStart=$dapod #" "$src/systemd/dapod.service" >"$tmp/dapod.service"
grep -q "^ExecStart=$dapod serve " "$tmp/dapod.service"
grep -q '^Type=notify$' "$tmp/dapod.service"

out=$(systemd-analyze verify --man=no "$tmp/dapod.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
  echo "systemd-analyze verify complained:"
  echo "$out"
  exit 1
fi
echo "verify: clean"

# The test can fail: a typo in a key is reported.
sed 's/^ProtectSystem=/ProtectSystm=/' "$tmp/dapod.service" >"$tmp/typo.service"
if [ -z "$(systemd-analyze verify --man=no "$tmp/typo.service" 2>&1)" ]; then
  echo "verify did not report an unknown key: this test would not notice one"
  exit 1
fi

sec=$(systemd-analyze security --offline=yes --threshold=20 "$tmp/dapod.service" 2>&1) || {
  echo "$sec"
  exit 1
}
echo "$sec" | tail -1
level=$(echo "$sec" | sed -n 's/.*Overall exposure level for dapod.service: \([0-9.]*\).*/\1/p')
[ -n "$level" ] || { echo "no exposure level in the output"; exit 1; }
awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }' || { echo "exposure $level > 2.0"; exit 1; }

# sysusers and tmpfiles snippets parse and create what they say under a scratch root.
if command -v systemd-sysusers >/dev/null 2>&1; then
  mkdir -p "$tmp/root/etc"
  : >"$tmp/root/etc/passwd"
  : >"$tmp/root/etc/group"
  systemd-sysusers --root="$tmp/root" "$src/systemd/dapod.sysusers"
  grep -q '^dapod:x:[0-9]*:[0-9]*:dapod DAPO fine-tuning daemon:/var/lib/dapod:/usr/sbin/nologin$' \
    "$tmp/root/etc/passwd" || { cat "$tmp/root/etc/passwd"; exit 1; }
  grep -q '^dapod:x:' "$tmp/root/etc/group"
  echo "sysusers: dapod user and group created"
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
  mkdir -p "$tmp/root/usr/share/dapod"
  cp "$src/systemd/dapod.example.json" "$tmp/root/usr/share/dapod/dapod.example.json"
  systemd-tmpfiles --root="$tmp/root" --create "$src/systemd/dapod.tmpfiles"
  [ -d "$tmp/root/var/lib/dapod/models" ]
  cmp "$tmp/root/etc/dapod/dapod.json" "$src/systemd/dapod.example.json"
  echo "changed" >"$tmp/root/etc/dapod/dapod.json"
  systemd-tmpfiles --root="$tmp/root" --create "$src/systemd/dapod.tmpfiles"
  [ "$(cat "$tmp/root/etc/dapod/dapod.json")" = changed ] || { echo "tmpfiles overwrote the config"; exit 1; }
  echo "tmpfiles: directories and the config copy (never overwritten)"
fi
echo "ok"
