#!/usr/bin/env python3
"""Turn benchmark runs (Google Benchmark JSON from wrapcert_bench and
bench/python_baseline.py) into a Markdown report and a log-log plot of time against module
count, one line per unwrap subject and the Python baseline.

    tools/bench_report.py cpp.json python.json --markdown report.md --plot report.svg

The plot needs matplotlib (Debian: apt-get install python3-matplotlib); without it the report
is written and the plot is skipped with a message.
"""
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

SERIES = {  # benchmark family on synthetic trees -> label in the plot
    "BM_NamedModulesWalk": "LibTorch named_modules() walk",
    "BM_UnwrapReference": "reference (C++)",
    "BM_UnwrapLegacy": "legacy (C++)",
    "BM_UnwrapDuckTyped": "duck-typed (C++)",
    "BM_PythonDuckTyped": "duck-typed (Python, PyTorch)",
}


def load(paths):
    times, context = defaultdict(list), {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        context[path] = data.get("context", {})
        for b in data.get("benchmarks", []):
            if b.get("run_type", "iteration") != "iteration":
                continue
            scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
            times[b.get("run_name", b["name"])].append(b["real_time"] * scale)
    return {k: statistics.median(v) for k, v in times.items()}, context


def series(medians):
    out = defaultdict(list)
    for name, t in medians.items():
        m = re.match(r"(BM_\w+)/modules:(\d+)$", name)
        if m and m.group(1) in SERIES:
            out[m.group(1)].append((int(m.group(2)), t))
    return {k: sorted(v) for k, v in out.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--plot")
    args = parser.parse_args()
    medians, context = load(args.runs)
    lines = ["# wrapcert benchmark report", ""]
    for path, ctx in context.items():
        keys = ("wrapcert_version", "libtorch_version", "torch_version", "python", "host_name",
                "num_cpus", "date")
        lines.append(f"- `{path}`: " + ", ".join(f"{k} {ctx[k]}" for k in keys if k in ctx))
    lines += ["", "| benchmark | median |", "|---|---:|"]
    for name in sorted(medians):
        lines.append(f"| {name} | {medians[name] / 1e6:.4f} ms |")
    ratios = []
    for n in (100, 1000, 10000, 60000, 100000):
        ref = medians.get(f"BM_UnwrapReference/modules:{n}")
        floor = medians.get(f"BM_NamedModulesWalk/modules:{n}")
        py = medians.get(f"BM_PythonDuckTyped/modules:{n}")
        if ref:
            vs_floor = f"{ref / floor:.2f}x" if floor else "-"
            vs_python = f"{py / ref:.0f}x" if py else "-"
            ratios.append(f"| {n} | {vs_floor} | {vs_python} |")
    for i, name in enumerate(("gemma-2b", "mistral-7b")):
        ref = medians.get(f"BM_UnwrapReferenceLayout/layout:{i}")
        floor = medians.get(f"BM_NamedModulesWalkLayout/layout:{i}")
        py = medians.get(f"BM_PythonDuckTypedLayout/layout:{i}")
        if ref and floor:
            ratios.append(f"| {name} | {ref / floor:.2f}x |" + (f" {py / ref:.0f}x |" if py else " - |"))
    if ratios:
        lines += ["", "| tree | reference / named_modules() | Python duck-typed / reference |",
                  "|---|---:|---:|"] + ratios
    with open(args.markdown, "w") as f:
        f.write("\n".join(lines) + "\n")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("bench_report: no matplotlib (apt-get install python3-matplotlib): no plot",
                  file=sys.stderr)
            return 0
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for family, points in series(medians).items():
            ax.plot([n for n, _ in points], [t / 1e6 for _, t in points], marker="o",
                    label=SERIES[family])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("modules in the tree")
        ax.set_ylabel("time (ms, median)")
        ax.set_title("Unwrap cost against tree size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
