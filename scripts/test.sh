#!/usr/bin/env bash
# Set up, build, and run every test through ctest. Extra arguments go to ctest
# (e.g. `scripts/test.sh -L unit`, `scripts/test.sh -R SeedThread`).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(pwd)/scripts/bootstrap.sh"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
