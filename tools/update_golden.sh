#!/usr/bin/env bash
# Rewrites the golden key listings under fixtures/golden/ from the built `wrapcert` tool.
# Run after an intended change to a fixture's layout, and review the diff before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${BUILD_DIR:-build}/wrapcert
for name in gemma-2b gemma-7b mistral-7b tiny-gemma tiny-mistral; do
  "$tool" fixture "$name" --keys > "fixtures/golden/$name.keys"
done
git --no-pager diff --stat -- fixtures/golden
