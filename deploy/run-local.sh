#!/usr/bin/env bash
# Runs a pipeline on the embedded default (one process, local state and artifact cache in
# .eddy/). Builds the operators and the eddy binary first. Default: the word-count example.
#   deploy/run-local.sh [pipeline.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
pipeline="${1:-examples/wordcount/pipeline.yaml}"
echo "building the example operators and eddy (first build takes several minutes)..."
cargo build --release --quiet -p eddy-guest-artifacts -p eddy-cli
exec target/release/eddy run "$pipeline"
