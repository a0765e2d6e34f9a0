#!/usr/bin/env bash
# Set up, build, and run the tests through ctest. Without arguments: every test but the `slow`
# profile, then the sanitizer and fuzzing stage (scripts/sanitize.sh; WRAPCERT_SANITIZERS=0
# leaves it out). With arguments, they go to ctest on the main build only (e.g.
# `scripts/test.sh -L unit`, `scripts/test.sh -L slow`, `scripts/test.sh -R SeedThread`).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(pwd)/scripts/bootstrap.sh"
if [ $# -gt 0 ]; then
  exec ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
fi
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" -LE slow
if [ "${WRAPCERT_SANITIZERS:-1}" != 0 ]; then
  "$(pwd)/scripts/sanitize.sh"
fi
