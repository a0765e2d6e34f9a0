#!/usr/bin/env python3
"""Checks that wrapcert's include graph points one way.

Every source file belongs to a library by its folder (src/CMakeLists.txt lists them). A file may
include headers of its own library and of the libraries below it, never above; within the whole
graph no two units (a header and its .cpp) include each other, directly or round a cycle;
public headers (each library's HEADERS file set) include no `detail/` header and every header
outside `detail/` is public. Tests (`*_test.cpp`) may include anything but the tool.

  tools/check_layers.py [ROOT]            exit 0 when the graph is clean, else 1 with the arrows
  tools/check_layers.py [ROOT] --graph    also print the layers, lowest first
"""

import argparse
import os
import re
import sys

# Library -> the libraries it may include (besides itself), lowest first.
ALLOWED = {
    "core": [],
    "io": ["core"],
    "gen": ["core"],
    "fixtures": ["core"],
    # The training loop (P17) saves and loads checkpoints in the formats trainers write.
    "certify": ["core", "io", "gen"],
    # Header-only glue between the fixtures and certification (fixtures/.../certification.h).
    "fixtures-certify": ["core", "gen", "certify", "fixtures"],
    "python": ["core", "io", "gen", "certify", "fixtures", "fixtures-certify"],
    "test_support": ["core", "io", "gen", "certify", "fixtures", "fixtures-certify", "python"],
    "cli": ["core", "io", "gen", "certify", "fixtures", "fixtures-certify", "python"],
}
ORDER = ["core", "io", "gen", "fixtures", "certify", "fixtures-certify", "python", "test_support",
         "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](wrapcert/[^>"]+)[>"]', re.M)


def library_of(rel):
    """The library a repository path belongs to, or None for files outside the libraries."""
    if rel in ("fixtures/include/wrapcert/fixtures/certification.h",
               "fixtures/certification.h"):
        return "fixtures-certify"
    if rel.startswith("fixtures/"):
        return "fixtures"
    if rel.startswith("src/cli/"):
        return "cli"
    if not rel.startswith("src/wrapcert/"):
        return None
    parts = rel[len("src/wrapcert/"):].split("/")
    if len(parts) > 1 and parts[0] in ("io", "gen", "certify", "python", "test_support"):
        return parts[0]
    return "core"


def header_path(root, include):
    """The repository path of an `#include <wrapcert/...>`."""
    for base in ("src", "fixtures/include"):
        if os.path.exists(os.path.join(root, base, include)):
            return base + "/" + include
    return None


def unit_of(rel):
    """A header and its .cpp (and its test) are one unit: `src/wrapcert/view`."""
    stem = os.path.splitext(rel)[0].replace("fixtures/include/wrapcert/fixtures/", "fixtures/")
    return stem[: -len("_test")] if stem.endswith("_test") else stem


def public_headers(root):
    """Headers named in wrapcert_public_headers(...) or a HEADERS file set, by repository path."""
    found = set()
    for folder, _, files in os.walk(os.path.join(root, "src")):
        if "CMakeLists.txt" not in files:
            continue
        text = open(os.path.join(folder, "CMakeLists.txt")).read()
        for call in re.findall(r"wrapcert_public_headers\(\s*\w+([^)]*)\)", text):
            for name in call.split():
                found.add(os.path.relpath(os.path.join(folder, name), root))
    text = open(os.path.join(root, "fixtures", "CMakeLists.txt")).read()
    for call in re.findall(r"FILE_SET HEADERS[^)]*?FILES([^)]*)\)", text):
        for name in call.split():
            found.add("fixtures/" + name)
    return found


def sources(root):
    for base in ("src", "fixtures"):
        for folder, _, files in os.walk(os.path.join(root, base)):
            for name in sorted(files):
                if name.endswith((".h", ".cpp")):
                    yield os.path.relpath(os.path.join(folder, name), root)


def strongly_connected(graph):
    """Tarjan's algorithm; returns the components with more than one unit."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--graph", action="store_true", help="print the layers")
    args = parser.parse_args()
    root = os.path.abspath(args.root)

    problems = []
    units = {}  # unit -> set of units it includes
    owner = {}  # unit -> its library (from its header or .cpp, not its test)
    publics = public_headers(root)
    for rel in sources(root):
        library = library_of(rel)
        if library is None:
            continue
        is_test = rel.endswith("_test.cpp")
        unit = unit_of(rel)
        units.setdefault(unit, set())
        if not is_test:
            owner[unit] = library
        text = open(os.path.join(root, rel), errors="replace").read()
        for include in INCLUDE.findall(text):
            target = header_path(root, include)
            if target is None:
                problems.append(f"{rel}: includes <{include}>, which does not exist")
                continue
            to = library_of(target)
            if is_test:
                if to == "cli":
                    problems.append(f"{rel}: a test includes the tool's <{include}>")
                continue
            if to != library and to not in ALLOWED[library]:
                problems.append(f"{rel} ({library}) includes <{include}> ({to}): points up")
            if unit_of(target) != unit:
                units[unit].add(unit_of(target))
            if rel in publics and "/detail/" in target:
                problems.append(f"{rel}: a public header includes the private <{include}>")
        if rel.endswith(".h") and library not in ("test_support", "cli"):
            public = rel in publics
            if "/detail/" in rel and public:
                problems.append(f"{rel}: a detail/ header in the public header set")
            if "/detail/" not in rel and not public:
                problems.append(f"{rel}: a header outside detail/ missing from the public set")
    for cycle in strongly_connected(units):
        problems.append("include cycle: " + " <-> ".join(cycle))

    if args.graph:
        depth = {}

        def level(u, seen=()):
            if u in depth:
                return depth[u]
            below = [level(v, seen + (u,)) for v in units.get(u, ()) if v not in seen]
            depth[u] = 1 + max(below, default=-1)
            return depth[u]

        for library in ORDER:
            members = sorted(u for u in units if owner.get(u) == library)
            if not members:
                continue
            print(f"{library} (may include: {', '.join(ALLOWED[library]) or 'LibTorch only'})")
            by_level = {}
            for u in members:
                by_level.setdefault(level(u), []).append(u)
            for n in sorted(by_level):
                names = ", ".join(os.path.basename(u) if "/detail/" not in u
                                  else "detail/" + os.path.basename(u) for u in by_level[n])
                print(f"  {n}: {names}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) in the include graph", file=sys.stderr)
        return 1
    if not args.graph:
        print(f"include graph clean: {len(units)} units, every arrow points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
