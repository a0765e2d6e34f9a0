#!/usr/bin/env bash
# Set up, build, and run the tests through ctest. Without arguments, every test but the
# `slow` profile; with arguments, they go to ctest (e.g. `scripts/test.sh -L unit`,
# `scripts/test.sh -L slow`, `scripts/test.sh -R SeedThread`).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(pwd)/scripts/bootstrap.sh"
if [ $# -eq 0 ]; then set -- -LE slow; fi
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
