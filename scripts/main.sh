#!/usr/bin/env bash
# The main job: set up, build, certify every built-in wrapper kind on generated trees and on the
# fixtures, and print the table. The legacy and duck-typed unwraps follow, to show where they
# fail. Arguments go to the reference run (`--cases 1000`, `--json report.json`, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(pwd)/scripts/bootstrap.sh" wrapcert_cli  # the command-line tool alone: no tests, no benchmarks
tool="${BUILD_DIR:-build}/wrapcert"
"$tool" certify "$@" && status=0 || status=$?
for subject in legacy duck_typed; do
  echo
  "$tool" certify --quiet --subject "$subject" --cases 30 || true  # expected to fail
done
exit "$status"
