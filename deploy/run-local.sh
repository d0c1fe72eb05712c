#!/usr/bin/env bash
# Runs a pipeline on the embedded default (one process, local state and artifact cache in
# .eddy/), building what it needs first. Default: the word-count example, which needs only
# what running needs (`deploy/setup.sh run`: no Python, Node or test services); any other
# pipeline builds every example operator, in every language (`deploy/setup.sh languages`).
#   deploy/run-local.sh [pipeline.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
pipeline="${1:-}"
if [ -z "$pipeline" ]; then
  pipeline=examples/wordcount/pipeline.yaml
  deploy/setup.sh run
  echo "building eddy and the word count's operators (the first build takes several minutes)..."
  cargo build --release --quiet -p eddy-cli
  # Where and how eddy-guest-artifacts builds Rust guests: the pipeline names them there.
  CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=debuginfo CARGO_PROFILE_RELEASE_LTO=true CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
    cargo build --release --quiet --target wasm32-wasip2 --target-dir target/wasm-guests \
    -p wordcount-split -p wordcount-count
else
  deploy/setup.sh languages
  echo "building eddy and the example operators (the first build takes several minutes)..."
  cargo build --release --quiet -p eddy-guest-artifacts -p eddy-cli
fi
exec target/release/eddy run "$pipeline"
