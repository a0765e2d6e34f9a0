#!/usr/bin/env python3
"""What a benchmark report was measured on: the code (commit, dirty flag), the build (type,
compiler, the exact flags the benchmark was compiled with), the machine (CPU model, cores, load)
and the Debian packages that matter. Written as JSON for tools/bench_report.py --context.

    tools/bench_context.py start --build build --out context.json   # before the runs
    tools/bench_context.py finish context.json --set mode=quick ...  # after: load, times

scripts/bench.sh runs both. Only the standard library; git, dpkg-query and the compiler are
asked when present.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys


def run(*cmd, cwd=None):
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def cmake_cache(build):
    values = {}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(r"([A-Za-z_0-9]+):[A-Z]+=(.*)$", line.rstrip("\n"))
                if m:
                    values[m.group(1)] = m.group(2)
    except OSError:
        pass
    return values


def compile_flags(build, source_suffix):
    """The compiler and its flags for one source, from compile_commands.json, without include
    directories, the output and the source."""
    try:
        with open(os.path.join(build, "compile_commands.json")) as f:
            commands = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None, None
    for c in commands:
        if c.get("file", "").endswith(source_suffix):
            args = c["arguments"] if "arguments" in c else shlex.split(c["command"])
            if args and os.path.basename(args[0]) == "ccache":
                args = args[1:]
            flags, skip = [], False
            for a in args[1:]:
                if skip:
                    skip = False
                elif a in ("-I", "-isystem", "-o", "-MF", "-MT", "-MQ"):
                    skip = True
                elif a.startswith(("-I", "-isystem", "-o", "-MF", "-MT", "-MQ")) or \
                        a in ("-c", "-MD", "-MMD") or a.endswith(source_suffix):
                    continue
                else:
                    flags.append(a)
            return args[0], " ".join(flags)
    return None, None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def start(args):
    root = run("git", "rev-parse", "--show-toplevel") or os.getcwd()
    cache = cmake_cache(args.build)
    build_type = cache.get("CMAKE_BUILD_TYPE", "")
    compiler, flags = compile_flags(args.build, "bench/unwrap_bench.cpp")
    compiler = compiler or cache.get("CMAKE_CXX_COMPILER")
    porcelain = run("git", "status", "--porcelain", cwd=root)
    packages = {}
    for p in ("libtorch-dev", "python3-torch", "libbenchmark-dev", "python3-scipy",
              "python3-matplotlib"):
        v = run("dpkg-query", "-W", "-f=${Version}", p)
        if v:
            packages[p] = v
    ctx = {
        "commit": run("git", "rev-parse", "HEAD", cwd=root),
        "commit_subject": run("git", "log", "-1", "--format=%s", cwd=root),
        "branch": run("git", "rev-parse", "--abbrev-ref", "HEAD", cwd=root),
        "dirty": bool(porcelain) if porcelain is not None else None,
        "dirty_files": len(porcelain.splitlines()) if porcelain else 0,
        "build_dir": os.path.abspath(args.build),
        "build_type": build_type or None,
        "cxx_compiler": compiler,
        "cxx_compiler_version": (run(compiler, "--version") or "").split("\n")[0] or None
        if compiler else None,
        "cxx_flags": flags,
        "cmake_cxx_flags": " ".join(x for x in (
            cache.get("CMAKE_CXX_FLAGS", ""),
            cache.get(f"CMAKE_CXX_FLAGS_{build_type.upper()}", "") if build_type else "")
            if x) or None,
        "compiler_launcher": (cache.get("CMAKE_CXX_COMPILER_LAUNCHER")
                              or cache.get("WRAPCERT_CCACHE") or None),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "load_start": loadavg(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "packages": packages,
    }
    with open(args.out, "w") as f:
        json.dump(ctx, f, indent=1)
    return 0


def parse_value(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def finish(args):
    with open(args.file) as f:
        ctx = json.load(f)
    ctx["load_end"] = loadavg()
    ctx["finished"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    for item in args.set or []:
        key, _, value = item.partition("=")
        ctx[key] = parse_value(value)
    with open(args.file, "w") as f:
        json.dump(ctx, f, indent=1)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start")
    s.add_argument("--build", default="build")
    s.add_argument("--out", required=True)
    f = sub.add_parser("finish")
    f.add_argument("file")
    f.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="add a field (VALUE read as JSON when it parses)")
    args = parser.parse_args()
    return start(args) if args.command == "start" else finish(args)


if __name__ == "__main__":
    sys.exit(main())
