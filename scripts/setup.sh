#!/usr/bin/env bash
# Installs the Debian packages dapod needs (only those missing), then configures and builds
# with CMake. Used by both README commands; safe to run again. Usage: setup.sh [BUILD_DIR [CMAKE_ARGS...]]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config git
      libopenblas-dev libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev libpcre2-dev libutf8proc-dev
      uuid-dev libsqlite3-dev nettle-dev libwebsockets-dev
      python3 python3-torch python3-numpy python3-jinja2 python3-fastapi python3-uvicorn
      clang-format curl openssl
      clang libclang-rt-14-dev wrk
      chromium
      systemd
      bubblewrap python3-nltk python3-jsonschema
      openmpi-bin libopenmpi-dev mpich libmpich-dev)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Node.js and npm (the reference tokenizers, the OpenAPI checks, the dashboard's assets and the
# browser test): Debian's packages when no node/npm is on the machine; an existing installation
# (e.g. a nodejs package from another repository, which ships its own npm) is left alone.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing missing Debian packages: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

build=${1:-build}
shift || true
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
