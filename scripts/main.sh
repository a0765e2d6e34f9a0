#!/usr/bin/env bash
# The main job: set up, build, and show the seed's bug and its fix on a wrapped model.
# Arguments are passed to `wrapcert demo` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(pwd)/scripts/bootstrap.sh"
exec "${BUILD_DIR:-build}/wrapcert" demo "$@"
