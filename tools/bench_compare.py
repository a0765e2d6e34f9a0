#!/usr/bin/env python3
"""Compare two benchmark runs (Google Benchmark JSON, from wrapcert_bench or
bench/python_baseline.py) and fail when a benchmark got slower beyond a threshold with
significance: usable as a CI gate.

    tools/bench_compare.py BASELINE.json CONTENDER.json [--threshold 0.10] [--alpha 0.05]

    tools/bench_compare.py BASELINE.json CONTENDER.json --markdown compare.md

Per benchmark: the median of each run's repetitions, the relative change, and a two-sided
Mann-Whitney U test over the repetitions (scipy.stats.mannwhitneyu; Debian: python3-scipy,
which the set-up installs). Fewer than 9 repetitions on either side is warned about: the test
has little power there. Exit status 1 when any benchmark regresses by more than the threshold
with p < alpha, 2 on bad input. --markdown also writes the table as Markdown (for
tools/bench_report.py --include).
"""
import argparse
import statistics
import sys
from collections import defaultdict

import bench_json

try:
    from scipy.stats import mannwhitneyu
except ImportError:
    sys.exit("bench_compare: needs scipy (Debian: apt-get install python3-scipy)")


def load(path):
    runs = defaultdict(list)
    for run in bench_json.read(path, "bench_compare")[1]:
        runs[run["name"]].append(run["real_ns"])
    return runs


def mann_whitney_p(a, b):
    """Two-sided p-value of the Mann-Whitney U test (scipy: exact for small samples without
    ties, else the normal approximation with tie correction)."""
    if not a or not b:
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def fmt_time(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.4g} {unit}"
    return f"{ns:.4g} ns"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline")
    parser.add_argument("contender")
    parser.add_argument("--threshold", type=float, default=0.10, help="relative slowdown")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level")
    parser.add_argument("--markdown", help="also write the table here, as Markdown")
    args = parser.parse_args()
    base, new = load(args.baseline), load(args.contender)
    common = [name for name in base if name in new]
    if not common:
        print("bench_compare: the runs share no benchmark", file=sys.stderr)
        return 2
    regressions, rows = 0, []
    print(f"{'benchmark':60} {'baseline':>12} {'contender':>12} {'change':>8} {'p':>7}")
    for name in common:
        a, b = base[name], new[name]
        ma, mb = statistics.median(a), statistics.median(b)
        change = (mb - ma) / ma if ma else 0.0
        p = mann_whitney_p(a, b)
        flag, verdict = "", "no significant change"
        if change > args.threshold and p < args.alpha:
            flag, verdict = "  REGRESSION", "**REGRESSION**"
            regressions += 1
        elif change < -args.threshold and p < args.alpha:
            verdict = "faster"
        elif min(len(a), len(b)) < 9:
            flag = f"  (only {min(len(a), len(b))} repetitions: run with --benchmark_repetitions=9)"
            verdict += f" (only {min(len(a), len(b))} repetitions)"
        print(f"{name[:60]:60} {ma / 1e6:10.3f}ms {mb / 1e6:10.3f}ms {change:+7.1%} {p:7.3f}{flag}")
        rows.append(f"| {name} | {fmt_time(ma)} | {fmt_time(mb)} | {change:+.1%} | "
                    f"{p:.3g} | {verdict} |")
    summary = (f"{regressions} benchmark(s) slower by more than {args.threshold:.0%} "
               f"(p < {args.alpha})" if regressions else
               f"no benchmark slower by more than {args.threshold:.0%} with p < {args.alpha}")
    if regressions:
        print(f"\n{summary}")
    if args.markdown:
        lines = [f"Gate: a benchmark regresses when its median is more than "
                 f"{args.threshold:.0%} slower and a two-sided Mann-Whitney U test over the "
                 f"repetitions gives p < {args.alpha}. Result: {summary}.", "",
                 "| benchmark | baseline (median) | contender (median) | change | p | verdict |",
                 "|---|---:|---:|---:|---:|---|"] + rows
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
