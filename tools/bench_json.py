"""Reading Google Benchmark's JSON output: the one loader of the benchmark tools.

    context, runs = bench_json.read("run.json", "bench_report")
    for run in runs:             # iterations only: no mean/median/stddev/cv, no complexity fit
        run["name"], run["real_ns"], run.get("cpu_ns"), run.get("error_occurred")
"""

import json
import sys

SCALE = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}


def read(path, tool):
    """The file's context block and its iteration runs, each the benchmark's own entry with
    `name` (the run name, without aggregate suffixes), `real_ns` and, when measured, `cpu_ns`.
    An unreadable file ends the tool with a message that names it."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{tool}: cannot read {path}: {e}")
    runs = []
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue  # mean/median/stddev/cv aggregates and complexity fits
        scale = SCALE[b.get("time_unit", "ns")]
        run = dict(b)
        run["name"] = b.get("run_name", b["name"])
        run["real_ns"] = b["real_time"] * scale
        if "cpu_time" in b:
            run["cpu_ns"] = b["cpu_time"] * scale
        runs.append(run)
    return data.get("context", {}), runs
