#!/usr/bin/env bash
# `wrapcert certify --plugin`: kinds from a shared library are certified (a correct one passes,
# a faulty one fails with its report written), and each way a plugin can be wrong is an error
# naming the file or the kind: a missing file, a library without the entry point, one that
# registers nothing, kinds registered twice, a kind asked for without its plugin.
#   tools/test_plugins.sh path/to/wrapcert path/to/test_plugin.so path/to/empty_plugin.so
set -uo pipefail
tool=$1 plugin=$2 empty=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run EXPECTED_EXIT ARGS...: output in $dir/out.txt
  local want=$1
  shift
  timeout 600 "$tool" "$@" > "$dir/out.txt" 2>&1
  local got=$?
  [ "$got" -eq "$want" ] || { cat "$dir/out.txt"; fail "wrapcert $* exited $got, not $want"; }
}
quick=(--cases 10 --seed 3 --fixtures tiny-gemma --quiet)

run 0 certify --plugin "$plugin" --wrappers PluginRelay "${quick[@]}"
grep -q "plugin $plugin: PluginRelay PluginLoudRelay" "$dir/out.txt" || fail "the kinds are not listed"
run 1 certify --plugin "$plugin" --wrappers PluginLoudRelay "${quick[@]}" --json "$dir/loud.json"
grep -q '"status": "failed"' "$dir/loud.json" || fail "the faulty kind's report"
run 64 certify --wrappers PluginRelay "${quick[@]}"
grep -q "unknown wrapper kind 'PluginRelay'" "$dir/out.txt" || fail "a kind without its plugin"
run 2 certify --plugin "$dir/none.so" "${quick[@]}"
grep -q "none.so.*cannot use the plugin" "$dir/out.txt" || fail "a missing plugin is not named"
libm=$(ls /lib/x86_64-linux-gnu/libm.so.6 /usr/lib/*/libm.so.6 2>/dev/null | head -n 1)
run 2 certify --plugin "$libm" "${quick[@]}"
grep -q "has no entry point wrapcert_register_kinds" "$dir/out.txt" || fail "a library without the entry"
run 2 certify --plugin "$empty" "${quick[@]}"
grep -q "registered no wrapper kind" "$dir/out.txt" || fail "a plugin that registers nothing"
run 2 certify --plugin "$plugin" --plugin "$plugin" "${quick[@]}"
grep -q "PluginRelay" "$dir/out.txt" || fail "kinds registered twice are not named"
echo "plugins: certified, rejected and refused as expected"
