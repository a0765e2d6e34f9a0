#!/usr/bin/env bash
# tools/check_layers.py passes on the repository and rejects, naming the arrow, a copy of it with
# an include that points up, a cycle, and a private header in the public set.
#   tools/test_check_layers.sh PYTHON
set -euo pipefail
python=$1
here=$(cd "$(dirname "$0")/.." && pwd)
check="$here/tools/check_layers.py"
expect="$here/tools/expect_exit.sh"
"$python" "$check" "$here"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fresh() {
  rm -rf "$work/repo"
  mkdir -p "$work/repo"
  cp -r "$here/src" "$here/fixtures" "$work/repo/"
  rm -rf "$work/repo/fixtures/golden"
}

fresh  # the core reaching up into certification
sed -i '1i #include <wrapcert/certify/certify.h>' "$work/repo/src/wrapcert/error.cpp"
"$expect" 1 --output "error.cpp (core) includes <wrapcert/certify/certify.h> (certify): points up" \
  -- "$python" "$check" "$work/repo"

fresh  # two core units that include each other
sed -i '1i #include <wrapcert/unwrap.h>' "$work/repo/src/wrapcert/view.cpp"
"$expect" 1 --output "include cycle: src/wrapcert/unwrap <-> src/wrapcert/view" \
  -- "$python" "$check" "$work/repo"

fresh  # a public header that needs a private one
sed -i '1i #include <wrapcert/detail/marks.h>' "$work/repo/src/wrapcert/keys.h"
"$expect" 1 --output "keys.h: a public header includes the private <wrapcert/detail/marks.h>" \
  -- "$python" "$check" "$work/repo"

fresh  # a new header nobody declared public
touch "$work/repo/src/wrapcert/io/sharding.h"
"$expect" 1 --output "io/sharding.h: a header outside detail/ missing from the public set" \
  -- "$python" "$check" "$work/repo"
echo "check_layers: passes here, rejects each broken copy"
