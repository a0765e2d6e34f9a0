#!/usr/bin/env bash
# clang-tidy with the checks in .clang-tidy on wrapcert's sources (src/, fixtures/, fuzz/); any
# finding fails. Uses the compile commands of the sanitizer build (clang), configuring it if
# needed. Arguments: files to check instead of all of them.
#   TIDY_BUILD_DIR  where compile_commands.json is (default: build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TIDY_BUILD_DIR:-build-asan}
if [ ! -f "$build/compile_commands.json" ]; then
  WRAPCERT_SANITIZERS=0 SANITIZE_BUILD_DIR="$build" ./scripts/sanitize.sh -N >/dev/null
fi
if [ $# -eq 0 ]; then
  mapfile -t files < <(git ls-files 'src/*.cpp' 'fixtures/*.cpp' 'fuzz/*.cpp')
else
  files=("$@")
fi
runner=$(command -v run-clang-tidy-14 || command -v run-clang-tidy)
"$runner" -p "$build" -quiet -j "$(nproc)" "${files[@]/#/$(pwd)/}"
