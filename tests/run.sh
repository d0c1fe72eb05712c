#!/usr/bin/env bash
# Runs every test: installs what is missing (deploy/setup.sh), then unit, integration,
# guest-program and doc tests of the host workspace (building every guest component on the
# way), then formatting and lints for host and guest code.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh tests
GUESTS=(-p eddy-sdk -p wordcount-split -p wordcount-count -p purchase-totals -p fraud-detector -p surge-request-counter -p surge-pricing -p nexmark-model -p nexmark-select -p nexmark-q1 -p nexmark-q2 -p nexmark-q3 -p nexmark-count -p nexmark-q5 -p nexmark-q7 -p nexmark-window-row -p nexmark-q8 -p nexmark-q8-rows -p hostile -p running-count -p running-count-v2 -p count-per-key-v2 -p tags -p missing-export -p command)
cargo fmt --all -- --check
cargo test
# The example operators' own unit tests: not default members (they build for wasm32-wasip2),
# so `cargo test` skips them; they build for the host here.
cargo test -p nexmark-model -p nexmark-select -p nexmark-count -p nexmark-q1 -p nexmark-q5 -p nexmark-q8
cargo clippy --all-targets -- -D warnings
cargo clippy --release --target wasm32-wasip2 "${GUESTS[@]}" -- -D warnings
# The Go SDK and Go operators: gofmt-clean and vetted (the glue compiles only inside a build).
GO_DIRS=(guest-sdk/go examples/wordcount/go/split examples/wordcount/go/count examples/purchase-totals/go examples/fraud-detector/go examples/polyglot/alert tests/guests/go-hostile tests/guests/go-tags)
gofmt="$(go env GOROOT)/bin/gofmt"
unformatted=$(for dir in "${GO_DIRS[@]}"; do "$gofmt" -l "$dir"/*.go; done; "$gofmt" -l guest-sdk/go/glue)
[ -z "$unformatted" ] || { echo "gofmt would change: $unformatted" >&2; exit 1; }
for dir in "${GO_DIRS[@]}"; do (cd "$dir" && GOPROXY=off GOFLAGS=-mod=mod GOWORK=off go vet ./...); done
