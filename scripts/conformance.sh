#!/usr/bin/env bash
# The conformance matrix: certifies every real wrapper this machine can run (torch's
# DataParallel, DistributedDataParallel at world sizes 1 and 2, checkpoint_wrapper reentrant and
# not, a stack) against the unwraps the ecosystem has used (wrapcert's reference, and
# re-creations of the root-only, the duck-typed recursive and the type-directed non-recursive
# unwrap, regression/python/known_unwraps.py), and writes docs/conformance.md.
#
#   scripts/conformance.sh [--check] [--tool PATH]
#
#   --check      write nothing; exit 1 when docs/conformance.md is not what this run gives
#   --tool PATH  the wrapcert executable (default: built into $BUILD_DIR, default build, by
#                scripts/bootstrap.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() { sed -n '2,12s/^# \{0,1\}//p' "$0"; }
check=0 tool=""
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=1 ;;
    --tool) tool=${2:?--tool needs a path}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "conformance: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$tool" ]; then
  "$root/scripts/bootstrap.sh" wrapcert
  tool="${BUILD_DIR:-build}/wrapcert"
fi

export PYTHONPATH="$root/regression/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONHASHSEED=0
work=$(mktemp -d)
# The workers are forked from one interpreter that imported torch once, and each run of the
# tool from one process of the tool that loaded LibTorch once (tools/preload.sh).
source "$root/tools/preload.sh"
trap 'preload_stop; rm -rf "$work"' EXIT
preload_start "$work"
tool_preload_start "$work" "$tool"

# WRAPPERS: '+' stacks wrappers (innermost first), '@N' runs at world size N.
wrappers=("DataParallel" "DistributedDataParallel" "DistributedDataParallel@2"
          "checkpoint_wrapper" "checkpoint_wrapper[reentrant]"
          "DataParallel+checkpoint_wrapper")
unwraps=("" "known_unwraps:root_only" "known_unwraps:duck_typed_recursive"
         "known_unwraps:type_directed_root")
n=0
for w in "${wrappers[@]}"; do
  for u in "${unwraps[@]}"; do
    # Float64 alone: the matrix compares unwraps; each dtype is certified per wrapper.
    args=(certify-python --seed 7 --cases 25 --dtypes float64 --quiet --json "$work/$n.json")
    stack=${w%@*}
    IFS=+ read -r -a names <<< "$stack"
    for name in "${names[@]}"; do
      args+=(--wrapper "$name")
      # torch's data-parallel wrappers promise `.module` is the module they wrap (P16).
      case "$name" in DataParallel | DistributedDataParallel) args+=(--alias "$name=module") ;; esac
    done
    [ "$stack" != "$w" ] && args+=(--world-size "${w#*@}")
    [ -n "$u" ] && args+=(--unwrap "$u")
    code=0
    "$tool" "${args[@]}" > "$work/$n.out" 2>&1 || code=$?
    if [ "$code" -gt 1 ]; then
      cat "$work/$n.out" >&2
      echo "conformance: wrapcert ${args[*]} exited $code" >&2
      exit 2
    fi
    printf '%s\t%s\t%s\n' "$w" "$u" "$n" >> "$work/runs.tsv"
    n=$((n + 1))
  done
done
/usr/bin/python3 tools/conformance_report.py "$work/runs.tsv" "$work" --root "$root" \
  --out "$work/conformance.md"
if [ "$check" = 1 ]; then
  if ! diff -u docs/conformance.md "$work/conformance.md"; then
    echo "conformance: docs/conformance.md is not current; run scripts/conformance.sh" >&2
    exit 1
  fi
  echo "conformance: docs/conformance.md is current"
else
  # Written beside, then renamed over the regular file (never through a link).
  if [ -e docs/conformance.md ] && [ ! -f docs/conformance.md -o -L docs/conformance.md ]; then
    echo "conformance: docs/conformance.md is not a regular file; not writing over it" >&2
    exit 2
  fi
  cp "$work/conformance.md" docs/.conformance.md.new
  mv -f docs/.conformance.md.new docs/conformance.md
  echo "conformance: wrote docs/conformance.md ($n runs)"
fi
