#!/usr/bin/env bash
# The benchmark report: builds the benchmark target (only), runs the C++ benchmarks and the
# Python baseline, and writes bench-report/: report.md, plot.svg and plot.png, the raw runs
# (cpp.json, python.json) and what they ran on (context.json).
#
#   scripts/bench.sh [--quick] [--busy] [--against OLD_DIR] [--out DIR] [--repetitions N]
#
#   --quick            a short run (two minutes or so): the layouts, trees up to 10,000
#                      modules and property throughput, fewer repetitions, shorter minimum
#                      times
#   --busy             every other core kept busy (a spinning shell loop each, at the
#                      benchmarks' priority) through the C++ and the Python runs, and trees of
#                      60,000 modules measured too: the condition of the 60,000-module target
# The report's targets table also shows the last recorded times of scripts/main.sh and
# scripts/test.sh in this checkout ($BUILD_DIR/main-times.json, test-times.json).
#   --against OLD_DIR  compare with an earlier report folder (its cpp.json and python.json)
#                      through tools/bench_compare.py, add the table to the report, and exit 1
#                      when a benchmark got significantly slower
#   --out DIR          where to write (default: bench-report); replaced only once the run is done
#   --repetitions N    repetitions of every figure (default: 9, quick: 7)
#
# BUILD_DIR, WRAPCERT_CMAKE_ARGS and WRAPCERT_NO_APT as for scripts/bootstrap.sh;
# WRAPCERT_PYTHON is the Python with python3-torch, scipy and matplotlib (default
# /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() { sed -n '2,24s/^# \{0,1\}//p' "$0"; }
quick=0 busy=0 against="" out=bench-report repetitions=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --busy) busy=1 ;;
    --against) against=${2:?--against needs a folder}; shift ;;
    --against=*) against=${1#*=} ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --out=*) out=${1#*=} ;;
    --repetitions) repetitions=${2:?--repetitions needs a number}; shift ;;
    --repetitions=*) repetitions=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$repetitions" ] && ! [[ "$repetitions" =~ ^[1-9][0-9]*$ ]]; then
  echo "bench: --repetitions needs a positive number, not '$repetitions'" >&2
  exit 2
fi
if [ -n "$against" ] && [ ! -f "$against/cpp.json" ]; then
  echo "bench: $against/cpp.json not found (--against takes an earlier report folder)" >&2
  exit 2
fi

BUILD_DIR=${BUILD_DIR:-build}
python=${WRAPCERT_PYTHON:-}
if [ -z "$python" ]; then
  if [ -x /usr/bin/python3 ]; then python=/usr/bin/python3; else python=python3; fi
fi
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Everything goes to a folder beside the destination, which replaces it at the end: an earlier
# report stays whole until a new one is complete.
parent=$(dirname "$out")
mkdir -p "$parent"
work=$(mktemp -d "$parent/.$(basename "$out").XXXXXX")
spinners=()
stop_spinners() {
  if [ ${#spinners[@]} -gt 0 ]; then
    kill "${spinners[@]}" 2>/dev/null || true
    wait "${spinners[@]}" 2>/dev/null || true
    spinners=()
  fi
}
trap 'stop_spinners; rm -rf "$work"' EXIT
if [ -n "$against" ]; then  # copied first: OLD_DIR may be the folder this run replaces
  mkdir "$work/against"
  cp "$against/cpp.json" "$work/against/"
  [ -f "$against/python.json" ] && cp "$against/python.json" "$work/against/"
fi

t_start=$(now)
echo "bench: building wrapcert_bench in $BUILD_DIR" >&2
"$root/scripts/bootstrap.sh" wrapcert_bench
t_built=$(now)
bench_bin="$BUILD_DIR/bench/wrapcert_bench"
"$python" tools/bench_context.py start --build "$BUILD_DIR" --out "$work/context.json"

if [ "$quick" = 1 ]; then
  mode=quick
  reps=${repetitions:-7}
  # The layouts, the synthetic trees up to 10,000 modules, and property throughput (with
  # certify-python on DataParallel as its Python peer); no chains or wide trees.
  trees='NamedModulesWalk|NamedParametersKeys|UnwrapReference|UnwrapLegacy|UnwrapDuckTyped'
  sizes=100,1000,10000
  if [ "$busy" = 1 ]; then sizes+=,60000; fi
  filter="^BM_[A-Za-z]+Layout(OnMeta)?/|^BM_TranslateKeys/|^BM_($trees)/modules:(${sizes//,/|})\$"
  filter+="|^BM_PropertyStructural\$|^BM_PropertyBackward/|^BM_PropertyTraining/|^BM_CertifyPython/wrapper:0/"
  cpp_args=(--benchmark_filter="$filter" --benchmark_min_time=0.05)
else
  mode=full
  reps=${repetitions:-9}
  cpp_args=()
  sizes=100,1000,10000,60000,100000
fi
cpp_cmd=("$bench_bin" "${cpp_args[@]}" --benchmark_repetitions="$reps"
         --benchmark_out="$work/cpp.json" --benchmark_out_format=json)
python_cmd=("$python" bench/python_baseline.py --repetitions "$reps" --sizes "$sizes"
            --out "$work/python.json")

busy_spinners=0
if [ "$busy" = 1 ]; then
  # One spinner a core but the benchmark's own: a neighbour that wants the CPU all the time.
  busy_spinners=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))
  for ((i = 0; i < busy_spinners; i++)); do
    ( while :; do :; done ) &
    spinners+=($!)
  done
  echo "bench: $busy_spinners spinning process(es) keep the other core(s) busy (--busy)" >&2
fi
echo "bench: C++ benchmarks ($mode, $reps repetitions; console output in $out/cpp.log)" >&2
t0=$(now)
"${cpp_cmd[@]}" >"$work/cpp.log" 2>&1 || {
  tail -n 20 "$work/cpp.log" >&2
  echo "bench: the C++ benchmarks failed" >&2
  exit 1
}
t1=$(now)
echo "bench: Python baseline ($reps repetitions, trees of $sizes modules)" >&2
"${python_cmd[@]}"
t2=$(now)
stop_spinners

status=0
sections=()
if [ -n "$against" ]; then
  for run in cpp python; do
    [ -f "$work/against/$run.json" ] || continue
    echo "bench: comparing $run.json with $against/$run.json" >&2
    rc=0
    "$python" tools/bench_compare.py "$work/against/$run.json" "$work/$run.json" \
        --markdown "$work/compare-$run.md" >&2 || rc=$?
    if [ "$rc" -gt "$status" ]; then status=$rc; fi
    if [ -f "$work/compare-$run.md" ]; then
      sections+=(--section "Compared with $against ($run.json)" "$work/compare-$run.md")
    fi
  done
fi

# Paths as they will be once the folder is in place.
relative() { sed "s#$work#$out#g" <<<"$*"; }
"$python" tools/bench_context.py finish "$work/context.json" \
    --set "mode=$mode" \
    --set "busy_spinners=$busy_spinners" \
    --set "cpp_command=$(relative "${cpp_cmd[*]}")" \
    --set "python_command=$(relative "${python_cmd[*]}")" \
    --set "wall_s={\"build\": $(elapsed "$t_start" "$t_built"), \"C++\": $(elapsed "$t0" "$t1"),
                   \"Python\": $(elapsed "$t1" "$t2"), \"total\": $(elapsed "$t_start" "$t2")}"
# The last recorded runs of the README's commands in this checkout, for the targets table.
times=()
for record in "$BUILD_DIR/main-times.json" "$BUILD_DIR/test-times.json"; do
  if [ -f "$record" ]; then times+=(--times "$record"); fi
done
"$python" tools/bench_report.py "$work/cpp.json" "$work/python.json" \
    --context "$work/context.json" --markdown "$work/report.md" \
    --plot "$work/plot.svg" --plot "$work/plot.png" "${sections[@]}" "${times[@]}"
rm -rf "$work/against"

rm -rf "$out"
mv "$work" "$out"
trap - EXIT
chmod 755 "$out"
echo "bench: wrote $out/report.md ($mode run, $(elapsed "$t_start" "$(now)") s)" >&2
sed -n '/^## Warnings/,/^## How/p' "$out/report.md" | grep '^- ' | sed 's/\*\*//g' >&2 || true
if [ "$status" = 1 ]; then
  echo "bench: significant regression against $against (see $out/report.md)" >&2
fi
exit "$status"
