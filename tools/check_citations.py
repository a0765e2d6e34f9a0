#!/usr/bin/env python3
"""Checks that every citation of docs/SEMANTICS.md in the repository resolves.

Code, tests and documents cite the semantics as `docs/SEMANTICS.md §N` (a section), `hazard N`
or `hazards N-M` (the numbered list of §2) and property ids `P1`-`P17` (§4). A citation of a
section, hazard or property the document does not have, or of the document by another path, is
reported with its file and line.

  tools/check_citations.py [ROOT]    exit 0 when every citation resolves, else 1
"""

import argparse
import os
import re
import sys

DOC = "docs/SEMANTICS.md"
SCANNED = (".cpp", ".h", ".py", ".sh", ".md", ".txt", ".cmake")
SKIPPED_DIRS = {".git", "build", "build-asan", "golden", "corpus", "__pycache__"}


def document(root):
    text = open(os.path.join(root, DOC)).read()
    sections = {int(n) for n in re.findall(r"^## (\d+)\.", text, re.M)}
    hazards_text = text.split("\n## 2.", 1)[1].split("\n## ", 1)[0]
    hazards = {int(n) for n in re.findall(r"^(\d+)\. \*\*", hazards_text, re.M)}
    properties_text = text.split("\n## 4.", 1)[1].split("\n## ", 1)[0]
    properties = {int(n) for n in re.findall(r"^- \*\*P(\d+) ", properties_text, re.M)}
    return sections, hazards, properties


def numbers(first, last):
    return range(int(first), int(last or first) + 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    sections, hazards, properties = document(root)

    problems = []
    cited = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if not name.endswith(SCANNED):
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)
            if rel.startswith(("tools/check_citations.py", "tools/test_check_citations.sh")):
                continue  # the checker's own patterns and its broken examples
            for number, line in enumerate(open(os.path.join(root, rel), errors="replace"), 1):
                where = f"{rel}:{number}"
                for match in re.finditer(r"([\w./-]*)SEMANTICS\.md", line):
                    cited += 1
                    path = match.group(1) + "SEMANTICS.md"
                    if rel != DOC and path not in (DOC, "SEMANTICS.md") and not path.endswith(
                            "/" + DOC):
                        problems.append(f"{where}: cites '{path}', not {DOC}")
                    elif rel not in (DOC, "README.md") and path == "SEMANTICS.md":
                        problems.append(f"{where}: cites 'SEMANTICS.md' without its folder "
                                        f"(write {DOC})")
                for match in re.finditer(r"§(\d+)", line):
                    cited += 1
                    if int(match.group(1)) not in sections:
                        problems.append(f"{where}: §{match.group(1)} is no section of {DOC}")
                for match in re.finditer(r"\bhazards? (\d+)(?:\s*[-–]\s*(\d+))?", line):
                    cited += 1
                    for n in numbers(*match.groups()):
                        if n not in hazards:
                            problems.append(f"{where}: hazard {n} is not in {DOC} §2")
                for match in re.finditer(r"\bP(\d+)(?:\s*[-–]\s*P?(\d+))?\b", line):
                    for n in numbers(*match.groups()):
                        if n not in properties:
                            problems.append(f"{where}: P{n} is no property of {DOC} §4")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} citation(s) that do not resolve", file=sys.stderr)
        return 1
    print(f"{cited} citations of {DOC} resolve ({len(sections)} sections, {len(hazards)} "
          f"hazards, P1-P{max(properties)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
