#!/usr/bin/env bash
# Set up, build, and run the tests through ctest. Without arguments: every test but the `slow`
# profile, each once: the unit, regression and adversarial suites in the sanitizer and fuzzing
# stage (scripts/sanitize.sh, built with clang under AddressSanitizer and UBSan), the others in
# the main build. WRAPCERT_SANITIZERS=0 leaves that stage out and runs every suite in the main
# build. With arguments, they go to ctest on the main build only (e.g.
# `scripts/test.sh -L unit`, `scripts/test.sh -L slow`, `scripts/test.sh -R SeedThread`,
# `scripts/test.sh -L area:io`), except --changed (below).
# Without arguments, the sanitizer build runs beside the main build and suites (at the lowest
# priority), and each stage's time is kept in $BUILD_DIR/test-times.json for the benchmark
# report.
set -euo pipefail
cd "$(dirname "$0")/.."
# glibc's malloc asks for transparent huge pages (`glibc.malloc.hugetlb=1`, glibc 2.35 and
# later; an older one ignores it): where the kernel gives them on request only (`madvise`),
# a test process that touches a gigabyte takes 512 faults of 2 MB, not 262,144 of
# 4 KB. On a 2-core virtual machine, where a fault is dear, the main suites took 11 % less CPU
# time (516 -> 458 s); compiling gained nothing measurable, and ASan's allocator is its own. A
# setting of your own for it in GLIBC_TUNABLES is kept.
case ":${GLIBC_TUNABLES:-}:" in
  *:glibc.malloc.hugetlb=*) ;;
  *) export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" ;;
esac
# `scripts/test.sh --changed [REF]`: builds the main build and runs, first, the tests that cover
# the folders changed since REF (default HEAD: what is not committed yet), by their `area:NAME`
# labels (a googletest suite's area is its source folder; the others are labelled where they
# are added); then, with --all, everything else. A change to the core library, the build or
# the test support runs every test. The full command (no arguments) stays CI's.
if [ "${1:-}" = --changed ]; then
  shift
  all=false
  [ "${1:-}" = --all ] && { all=true; shift; }
  ref=${1:-HEAD}
  areas=()
  every=false
  while IFS= read -r file; do
    case "$file" in
      src/wrapcert/io/* | tools/test_check_keys* | tools/dcp_standin.py) areas+=(io) ;;
      src/wrapcert/gen/*) areas+=(gen) ;;
      src/wrapcert/certify/* | tools/test_ranks.sh | tools/test_plugins.sh) areas+=(certify) ;;
      src/wrapcert/python/* | tools/test_certify_python.sh) areas+=(python) ;;
      tools/python/* | tools/preload.sh) areas+=(python io cli) ;;
      src/cli/* | tools/test_tool_server.py) areas+=(cli) ;;
      fixtures/*) areas+=(fixtures) ;;
      regression/*) areas+=(regression) ;;
      property_tests/*) areas+=(property_tests) ;;
      fuzz/*) areas+=(fuzz) ;;
      bench/* | tools/bench_*) areas+=(bench) ;;
      docs/* | README.md) areas+=(docs) ;;
      scripts/* | tools/test_test_script.sh) areas+=(scripts) ;;
      src/wrapcert/* | src/CMakeLists.txt | CMakeLists.txt | cmake/* | .ci/*) every=true ;;
      *) ;;
    esac
  done < <({ git diff --name-only "$ref" --; git ls-files --others --exclude-standard; } | sort -u)
  "$(pwd)/scripts/bootstrap.sh"
  run() { ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"; }
  if $every; then
    echo "wrapcert: the core, the build or the test support changed: every test"
    run -LE slow
    exit 0
  fi
  if [ ${#areas[@]} -eq 0 ]; then
    echo "wrapcert: no change since $ref that a test covers"
  else
    mapfile -t areas < <(printf '%s\n' "${areas[@]}" | sort -u)
    pattern="area:($(IFS='|'; echo "${areas[*]}"))"
    echo "wrapcert: tests covering ${areas[*]} (-L '$pattern'), and the layering checks"
    run -L "$pattern|^layers$" -LE slow
  fi
  if $all; then
    echo "wrapcert: then every other test"
    run -LE "slow${areas:+|area:($(IFS='|'; echo "${areas[*]}"))}"
  fi
  exit 0
fi
if [ $# -gt 0 ] || [ "${WRAPCERT_SANITIZERS:-1}" = 0 ]; then
  "$(pwd)/scripts/bootstrap.sh"
  [ $# -gt 0 ] || set -- -LE slow
  exec ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
fi
# Each stage's wall time goes to $BUILD_DIR/test-times.json once every stage passed, for the
# benchmark report (scripts/bench.sh): "fresh" says whether the build folders were new.
build_dir=${BUILD_DIR:-build}
fresh=true
[ -e "$build_dir/CMakeCache.txt" ] || [ -e "${SANITIZE_BUILD_DIR:-build-asan}/CMakeCache.txt" ] &&
  fresh=false
now() { date +%s.%N; }
t0=$(now)
# Packages first, once: the two builds below would otherwise both install them.
"$(pwd)/scripts/bootstrap.sh" --packages
# The sanitizer build runs beside the main build and then the main suites, at the lowest
# priority: it gets the CPU time they leave idle (a build's last long unit and its links, Python
# workers starting, ranks that run one at a time, limits waited out) and little else. Its own
# process group (job control on while it starts), so that a failed main build or suite stops
# all of it; the same session, where Linux's autogroups would otherwise give it as much CPU
# time as the suites.
mkdir -p "$build_dir"
sanitizer_log="$build_dir/sanitizer-build.log"
if [ -L "$sanitizer_log" ] || { [ -e "$sanitizer_log" ] && [ ! -f "$sanitizer_log" ]; }; then
  echo "wrapcert: $sanitizer_log is not a regular file; not writing over it" >&2
  exit 1
fi
set -m
WRAPCERT_NO_APT=1 nice -n 19 "$(pwd)/scripts/sanitize.sh" --build-only > "$sanitizer_log" 2>&1 &
sanitizer_build=$!
set +m
trap '[ -z "$sanitizer_build" ] || kill -- "-$sanitizer_build" 2>/dev/null || true' EXIT
# The sanitizer stage builds and runs these suites (the same tests, by the same labels).
"$(pwd)/scripts/bootstrap.sh" wrapcert_main_suites
t1=$(now)
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" \
  -LE 'slow|unit|regression|adversarial'
t2=$(now)
echo "wrapcert: the sanitizer build, beside the main build and suites:"
built=0
wait "$sanitizer_build" || built=$?
sanitizer_build=""
cat "$sanitizer_log"
[ "$built" -eq 0 ] || exit "$built"
t3=$(now)
"$(pwd)/scripts/sanitize.sh"  # the build is current: this runs the suites
t4=$(now)
python3 tools/record_times.py "$build_dir/test-times.json" --command scripts/test.sh \
  --fresh "$fresh" --stage "build=$t0,$t1" --stage "main suites=$t1,$t2" \
  --stage "sanitizer build after the main suites=$t2,$t3" \
  --stage "sanitizer suites=$t3,$t4" || true
