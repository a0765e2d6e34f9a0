#!/usr/bin/env bash
# Installs the built wrapcert into a prefix, builds examples/certify-my-wrapper against the
# installed package (as a wrapper author would), runs its tests, and certifies its plugin with
# the installed command-line tool: the correct kind passes (0), the faulty one fails (1).
#   tools/test_installed_example.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
prefix="$build/_install"
cmake --install "$build" --prefix "$prefix" >/dev/null
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Configured as the example's own comment says (no build type): its two units compile in 5
# CPU-seconds less than at Release's -O3, and what its tests run is the installed library's.
cmake -S "$src/examples/certify-my-wrapper" -B "$build/_example" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" >/dev/null
cmake --build "$build/_example" >/dev/null
# In any order, again and again: no certification depends on what ran before it.
"$build/_example/certify_my_wrapper_tests" --gtest_shuffle --gtest_repeat=5
quick=(--cases 20 --seed 2026 --fixtures tiny-gemma --quiet)
"$prefix/bin/wrapcert" certify --plugin "$build/_example/libmy_kinds.so" --wrappers Sharded \
  "${quick[@]}" > /dev/null
status=0
"$prefix/bin/wrapcert" certify --plugin "$build/_example/libmy_kinds.so" --wrappers LeakySharded \
  "${quick[@]}" > /dev/null || status=$?
if [ "$status" -ne 1 ]; then
  echo "FAIL: the installed tool gave $status, not 1, for the faulty plugin kind" >&2
  exit 1
fi
echo "the installed tool certifies the plugin's correct kind and rejects its faulty one"
