#!/usr/bin/env bash
# The main job: set up, build, and replay the seed thread on gemma-2b (full size, meta device).
# Arguments are passed to `wrapcert seed` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
"$(pwd)/scripts/bootstrap.sh"
exec "${BUILD_DIR:-build}/wrapcert" seed "$@"
