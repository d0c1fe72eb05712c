#!/usr/bin/env bash
# Installs what building and testing Eddy needs on a fresh machine (Rust toolchain present):
# the wasm32-wasip2 target and componentize-py (for the Python example operator).
# Idempotent: fast when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPONENTIZE_PY_VERSION=0.25.1

# rust-toolchain.toml pins the toolchain and lists the target; this makes sure it is present.
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  echo "setup: adding the wasm32-wasip2 target"
  rustup target add wasm32-wasip2
fi

if ! command -v componentize-py >/dev/null 2>&1 || [ "$(componentize-py --version 2>/dev/null | awk '{print $2}')" != "$COMPONENTIZE_PY_VERSION" ]; then
  echo "setup: installing componentize-py $COMPONENTIZE_PY_VERSION (Python operators)"
  python3 -m pip install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
  hash -r
fi
command -v componentize-py >/dev/null || { echo "setup: componentize-py is installed but not on PATH" >&2; exit 1; }
