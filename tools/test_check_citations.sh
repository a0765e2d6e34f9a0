#!/usr/bin/env bash
# tools/check_citations.py passes on the repository and rejects, naming file and line, a copy
# that cites a section, a hazard and a property docs/SEMANTICS.md does not have.
#   tools/test_check_citations.sh PYTHON
set -euo pipefail
python=$1
here=$(cd "$(dirname "$0")/.." && pwd)
check="$here/tools/check_citations.py"
expect="$here/tools/expect_exit.sh"
"$python" "$check" "$here"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo/docs" "$work/repo/src"
cp "$here/docs/SEMANTICS.md" "$work/repo/docs/"
printf '// fine: docs/SEMANTICS.md §4, hazards 1-3, P16\n' >"$work/repo/src/a.h"
"$python" "$check" "$work/repo"
printf '// docs/SEMANTICS.md §9\n' >"$work/repo/src/b.h"
"$expect" 1 --output "src/b.h:1: §9 is no section of docs/SEMANTICS.md" \
  -- "$python" "$check" "$work/repo"
printf '// the duck-typing bug (hazard 12)\n' >"$work/repo/src/b.h"
"$expect" 1 --output "src/b.h:1: hazard 12 is not in docs/SEMANTICS.md §2" \
  -- "$python" "$check" "$work/repo"
printf '// P1-P18 hold\n' >"$work/repo/src/b.h"
"$expect" 1 --output "src/b.h:1: P18 is no property of docs/SEMANTICS.md §4" \
  -- "$python" "$check" "$work/repo"
printf '// see notes/SEMANTICS.md\n' >"$work/repo/src/b.h"
"$expect" 1 --output "cites 'notes/SEMANTICS.md', not docs/SEMANTICS.md" \
  -- "$python" "$check" "$work/repo"
echo "check_citations: passes here, rejects each broken citation"
