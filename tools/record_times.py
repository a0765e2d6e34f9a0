#!/usr/bin/env python3
"""Keeps the wall time of a command's stages for the benchmark report (scripts/bench.sh).

    tools/record_times.py OUT --command scripts/test.sh --fresh true \\
        --stage build=T0,T1 --stage "main suites=T1,T2"

Each stage is NAME=START,END in seconds since the epoch (`date +%s.%N`). Writes OUT as JSON:
the command, the commit it ran at (and whether the tree had changes), when it finished,
whether the build folders were new, and the seconds of each stage and in all. OUT is written
beside itself and renamed into place, and never written through a link or onto anything that
is not a regular file.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--command", required=True)
    parser.add_argument("--fresh", choices=["true", "false"], required=True,
                        help="whether the build folders were new")
    parser.add_argument("--stage", action="append", default=[], metavar="NAME=START,END")
    args = parser.parse_args()
    seconds = {}
    for stage in args.stage:
        name, _, span = stage.partition("=")
        try:
            start, end = (float(x) for x in span.split(","))
        except ValueError:
            parser.error(f"--stage takes NAME=START,END, not '{stage}'")
        seconds[name] = round(end - start, 1)
    if seconds:
        seconds["total"] = round(sum(seconds.values()), 1)
    if os.path.islink(args.out) or (os.path.lexists(args.out) and not os.path.isfile(args.out)):
        sys.exit(f"record_times: {args.out} is not a regular file: left as it is")
    record = {"command": args.command, "commit": git("rev-parse", "HEAD"),
              "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "fresh_build_folders": args.fresh == "true", "seconds": seconds}
    folder = os.path.dirname(os.path.abspath(args.out))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".times.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(tmp, args.out)
    except BaseException:
        os.unlink(tmp)
        raise


if __name__ == "__main__":
    main()
