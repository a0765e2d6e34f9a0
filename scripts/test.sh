#!/usr/bin/env bash
# Set up, build, and run the tests through ctest. Without arguments: every test but the `slow`
# profile, each once: the unit, regression and adversarial suites in the sanitizer and fuzzing
# stage (scripts/sanitize.sh, built with clang under AddressSanitizer and UBSan), the others in
# the main build. WRAPCERT_SANITIZERS=0 leaves that stage out and runs every suite in the main
# build. With arguments, they go to ctest on the main build only (e.g.
# `scripts/test.sh -L unit`, `scripts/test.sh -L slow`, `scripts/test.sh -R SeedThread`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ] || [ "${WRAPCERT_SANITIZERS:-1}" = 0 ]; then
  "$(pwd)/scripts/bootstrap.sh"
  [ $# -gt 0 ] || set -- -LE slow
  exec ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
fi
# The sanitizer stage builds and runs these suites (the same tests, by the same labels).
"$(pwd)/scripts/bootstrap.sh" wrapcert_main_suites
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" \
  -LE 'slow|unit|regression|adversarial'
"$(pwd)/scripts/sanitize.sh"
