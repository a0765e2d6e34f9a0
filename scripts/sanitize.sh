#!/usr/bin/env bash
# The sanitizer and fuzzing stage of the tests (scripts/test.sh runs it after the main suite).
# Builds wrapcert with clang in build-asan/: AddressSanitizer and UndefinedBehaviorSanitizer
# (LeakSanitizer on, every report fatal) plus libFuzzer coverage, only the suites it runs (the
# whole build when given arguments). Then runs the unit, regression and adversarial suites, a
# reduced property profile, and each fuzz target for WRAPCERT_FUZZ_SECONDS (default 20) from
# its committed corpus. Arguments go to ctest instead; `--build-only` builds the suites and runs
# nothing (scripts/test.sh builds them beside the main build and suites).
#   SANITIZE_BUILD_DIR  build folder (default: build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

export BUILD_DIR=${SANITIZE_BUILD_DIR:-build-asan}
# Line tables make ccache hash the build folder's absolute path; leave it out so clones share
# the cache (the debug info then names the folder of the clone that compiled it first).
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
# The `Sanitize` build type is -O1 with line tables: affordable on two cores, readable reports.
export WRAPCERT_CMAKE_ARGS="-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Sanitize \
  -DWRAPCERT_SANITIZE=address,undefined \
  -DWRAPCERT_BUILD_FUZZERS=ON -DWRAPCERT_BUILD_BENCHMARKS=OFF -DWRAPCERT_INSTALL=OFF \
  -DWRAPCERT_FUZZ_SECONDS=${WRAPCERT_FUZZ_SECONDS:-20} ${WRAPCERT_CMAKE_ARGS:-}"
if [ "${1:-}" = --build-only ]; then
  exec "$root/scripts/bootstrap.sh" wrapcert_sanitizer_suites
elif [ $# -gt 0 ]; then
  "$root/scripts/bootstrap.sh"  # ctest may be asked for any suite
else
  "$root/scripts/bootstrap.sh" wrapcert_sanitizer_suites  # what the stage below runs
fi

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:\
check_initialization_order=1:strict_init_order=1:detect_invalid_pointer_pairs=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$root/tools/sanitizers/lsan.supp:print_suppressions=0"
# Properties: the faulty-subject checks keep the profile they are given (they must find their
# counterexample); the Generated/Reference properties run a reduced profile with the pinned seed.
seed=$(sed -n 's/.*\bseed=\([0-9]*\).*/\1/p' <<<"${RC_PARAMS:-}")
reduced="${seed:+seed=$seed }max_success=25 max_size=60"

run() { ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"; }
if [ $# -gt 0 ]; then
  run "$@"
else
  run -L 'unit|regression|adversarial|property|fuzz' -LE slow -E '^Generated/Reference$'
  RC_PARAMS="$reduced" run -L property -LE slow -R '^Generated/Reference$'
fi
