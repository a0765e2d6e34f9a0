#!/usr/bin/env bash
# Runs a command and passes only on the exact exit code, with the output holding a text when one
# is given: a test that wants a failure must get that failure, not any.
#   tools/expect_exit.sh CODE [--output TEXT] -- COMMAND [ARGS...]
set -uo pipefail
want=$1
shift
text=
if [ "${1:-}" = --output ]; then
  text=$2
  shift 2
fi
[ "${1:-}" = -- ] && shift
out=$("$@" 2>&1)
got=$?
if [ "$got" -ne "$want" ]; then
  printf '%s\n' "$out"
  echo "FAIL: exited $got, not $want: $*"
  exit 1
fi
if [ -n "$text" ] && [[ "$out" != *"$text"* ]]; then
  printf '%s\n' "$out"
  echo "FAIL: the output does not hold '$text': $*"
  exit 1
fi
echo "exited $want as expected"
