#!/usr/bin/env bash
# The main job: set up, build, certify every built-in wrapper kind on generated trees and on the
# fixtures, and print the table; then the kinds that work across ranks, on two local ranks. The
# legacy and duck-typed unwraps follow, to show where they fail. Arguments go to the reference
# run (`--cases 1000`, `--json report.json`, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=true
[ -e "${BUILD_DIR:-build}/CMakeCache.txt" ] && fresh=false
t0=$(date +%s.%N)
"$(pwd)/scripts/bootstrap.sh" wrapcert_cli  # the command-line tool alone: no tests, no benchmarks
t1=$(date +%s.%N)
tool="${BUILD_DIR:-build}/wrapcert"
"$tool" certify "$@" && status=0 || status=$?
echo
# The kinds that shard or reduce across ranks, on two local ranks (torch.distributed's Gloo).
"$tool" certify --world-size 2 --cases 30 --quiet || status=1
for subject in legacy duck_typed; do
  echo
  "$tool" certify --quiet --subject "$subject" --cases 30 || true  # expected to fail
done
# The stages' wall time, for the benchmark report (scripts/bench.sh).
python3 tools/record_times.py "${BUILD_DIR:-build}/main-times.json" --command scripts/main.sh \
  --fresh "$fresh" --stage "build=$t0,$t1" --stage "certifications=$t1,$(date +%s.%N)" || true
exit "$status"
