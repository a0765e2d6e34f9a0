#!/usr/bin/env python3
"""Compare two benchmark runs (Google Benchmark JSON, from wrapcert_bench or
bench/python_baseline.py) and fail when a benchmark got slower beyond a threshold with
significance: usable as a CI gate.

    tools/bench_compare.py BASELINE.json CONTENDER.json [--threshold 0.10] [--alpha 0.05]

Per benchmark: the median of each run's repetitions, the relative change, and a two-sided
Mann-Whitney U test over the repetitions (normal approximation with tie correction, written
here: the standard library has none and scipy is not required). Fewer than 9 repetitions on
either side is warned about: the test has little power there. Exit status 1 when any benchmark
regresses by more than the threshold with p < alpha, 2 on bad input.
"""
import argparse
import json
import math
import statistics
import sys
from collections import defaultdict


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"bench_compare: cannot read {path}: {e}")
    runs = defaultdict(list)
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue  # mean/median/stddev aggregates
        scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        runs[b.get("run_name", b["name"])].append(b["real_time"] * scale)
    return runs


def mann_whitney_p(a, b):
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected)."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    values = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks, i, ties = [0.0] * len(values), 0, 0.0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1][0] == values[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, values) if g == 0)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))) if n > 1 else 0
    if sigma == 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / sigma
    return math.erfc(max(z, 0) / math.sqrt(2))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline")
    parser.add_argument("contender")
    parser.add_argument("--threshold", type=float, default=0.10, help="relative slowdown")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level")
    args = parser.parse_args()
    base, new = load(args.baseline), load(args.contender)
    common = [name for name in base if name in new]
    if not common:
        print("bench_compare: the runs share no benchmark", file=sys.stderr)
        return 2
    regressions = 0
    print(f"{'benchmark':60} {'baseline':>12} {'contender':>12} {'change':>8} {'p':>7}")
    for name in common:
        a, b = base[name], new[name]
        ma, mb = statistics.median(a), statistics.median(b)
        change = (mb - ma) / ma if ma else 0.0
        p = mann_whitney_p(a, b)
        flag = ""
        if change > args.threshold and p < args.alpha:
            flag = "  REGRESSION"
            regressions += 1
        elif min(len(a), len(b)) < 9:
            flag = f"  (only {min(len(a), len(b))} repetitions: run with --benchmark_repetitions=9)"
        print(f"{name[:60]:60} {ma / 1e6:10.3f}ms {mb / 1e6:10.3f}ms {change:+7.1%} {p:7.3f}{flag}")
    if regressions:
        print(f"\n{regressions} benchmark(s) slower by more than {args.threshold:.0%} (p < {args.alpha})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
