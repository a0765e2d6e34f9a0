#!/usr/bin/env python3
"""Tests of the benchmark report and the compare gate, on recorded runs (bench/testdata/) and on
runs made up here to have a known spread. Run by ctest (label `cli`, bench/CMakeLists.txt), or:

    /usr/bin/python3 tools/bench_report_test.py [TestClass ...]
"""
import importlib.util
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")
DATA = os.path.join(ROOT, "bench", "testdata")
REPORT = os.path.join(TOOLS, "bench_report.py")
COMPARE = os.path.join(TOOLS, "bench_compare.py")
# The recorded quick run: scripts/bench.sh --quick, aggregates left out.
RECORDED = [os.path.join(DATA, "report_cpp.json"), os.path.join(DATA, "report_python.json")]
RECORDED_CONTEXT = os.path.join(DATA, "report_context.json")

sys.path.insert(0, TOOLS)
import bench_report  # noqa: E402

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run(*args, env=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=300)


def section(text, title):
    """The body of the `## title` or `### title` section."""
    m = re.search(r"^#{2,3} " + re.escape(title) + r"[^\n]*\n(.*?)(?=^#{2,3} |\Z)", text,
                  re.M | re.S)
    return m.group(1) if m else None


def table_rows(body):
    """{first cell: [cells]} of the Markdown table in body."""
    rows = {}
    for line in body.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


def entries(name, times, cpu_share=1.0, label=""):
    """Google Benchmark JSON entries for one benchmark, one per repetition (times in ns)."""
    return [{"name": name, "run_name": name, "run_type": "iteration",
             "repetitions": len(times), "repetition_index": i, "iterations": 100,
             "real_time": t, "cpu_time": t * cpu_share, "time_unit": "ns", "label": label}
            for i, t in enumerate(times)]


def spread_around(center, relative, n):
    """n values evenly spread over center * (1 +- relative), in a fixed shuffled order."""
    if n == 1:
        return [center]
    values = [center * (1 - relative + 2 * relative * i / (n - 1)) for i in range(n)]
    return values[1::2] + values[0::2]


class Figure(bench_report.Figure):
    def __init__(self, times):
        super().__init__("made-up", "test")
        self.times = list(times)


class Workdir(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def write_json(self, name, data):
        with open(self.path(name), "w") as f:
            json.dump(data, f)
        return self.path(name)

    def make_report(self, runs, context=None, plots=(), extra=()):
        args = [REPORT, *runs, "--markdown", self.path("report.md")]
        if context:
            args += ["--context", context]
        for p in plots:
            args += ["--plot", self.path(p)]
        result = run(*args, *extra)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(self.path("report.md")) as f:
            return f.read(), result


class RecordedRun(Workdir):
    """The report built from a recorded quick run of this machine's benchmarks."""

    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "report.md")
            result = run(REPORT, *RECORDED, "--context", RECORDED_CONTEXT, "--markdown", out)
            if result.returncode != 0:
                raise AssertionError(f"bench_report.py failed: {result.stderr}")
            with open(out) as f:
                cls.text = f.read()
        with open(RECORDED_CONTEXT) as f:
            cls.context = json.load(f)

    def test_a_table_per_tree_with_every_subject(self):
        for tree in ("gemma-2b", "mistral-7b", "synthetic tree, 100 modules",
                     "synthetic tree, 1,000 modules", "synthetic tree, 10,000 modules"):
            body = section(self.text, tree)
            self.assertIsNotNone(body, tree)
            rows = table_rows(body)
            expected = ["duck-typed (Python, PyTorch)", "reference (C++)", "legacy (C++)",
                        "duck-typed (C++)", "LibTorch named_modules() walk"]
            if tree.startswith("synthetic"):
                expected.append("LibTorch named_parameters() keys")
            for subject in expected:
                self.assertIn(subject, rows, f"{tree}: {subject}")
                cells = rows[subject]
                # median, min - max, CV, repetitions
                self.assertRegex(cells[1], r"^[\d.]+ (ns|µs|ms|s)$")
                self.assertRegex(cells[2], r"^[\d.]+ (ns|µs|ms|s) – [\d.]+ (ns|µs|ms|s)$")
                self.assertRegex(cells[3], r"^(\*\*)?[\d.]+%( noisy\*\*)?$")
                self.assertEqual(cells[4], "7")
            self.assertEqual(rows["reference (C++)"][5], "1")

    def test_ratios_come_with_intervals_that_hold_the_estimate(self):
        body = section(self.text, "Ratios")
        self.assertIsNotNone(body)
        cells = re.findall(r"([\d.]+)× \(([\d.]+)–([\d.∞]+)\)", body)
        self.assertGreaterEqual(len(cells), 12)
        for estimate, low, high in cells:
            high = math.inf if high == "∞" else float(high)
            self.assertLessEqual(float(low), float(estimate))
            self.assertLessEqual(float(estimate), high)
        # Python against the same algorithm in C++ on 10,000 modules: several times slower,
        # decided even on a busy machine.
        rows = table_rows(body)
        python_vs_cpp = rows["synthetic tree, 10,000 modules"][2]
        low = float(re.match(r"[\d.]+× \(([\d.]+)–", python_vs_cpp).group(1))
        self.assertGreater(low, 2, python_vs_cpp)
        self.assertNotIn("undecidable", python_vs_cpp)

    def test_the_context_ties_the_report_to_its_code_and_machine(self):
        rows = table_rows(section(self.text, "Context"))
        self.assertIn(self.context["commit"], rows["commit"][1])
        self.assertIn("clean" if not self.context["dirty"] else "dirty", rows["commit"][1])
        self.assertEqual(rows["build type"][1], self.context["build_type"])
        self.assertIn(self.context["cxx_compiler_version"], rows["compiler"][1])
        self.assertIn("-O3", rows["flags (bench/unwrap_bench.cpp)"][1])
        threads = r"(single-threaded|\d+ intra-op threads) \(its default here"
        self.assertRegex(rows["LibTorch"][1], r"^1\.13\.\d+, " + threads)
        self.assertRegex(rows["PyTorch (Python baseline)"][1], r"^1\.13\.\S+, " + threads)
        self.assertEqual(rows["CPU"][1], self.context["cpu_model"])
        self.assertTrue(rows["cores"][1].startswith(str(self.context["cores"])))
        loads = rows["load average (1 / 5 / 15 min)"][1]
        self.assertIn("start ", loads)
        self.assertIn("end ", loads)

    def test_it_says_what_each_baseline_is(self):
        body = section(self.text, "What is measured")
        self.assertIn("extract_model_from_parallel(model, recursive=True)", body)
        self.assertIn("`_recursive_unwrap`", body)
        self.assertIn("re-creation", body)
        self.assertIn("stand-in", body)
        self.assertRegex(body, r"Run on PyTorch 1\.13\.\S+ \(Debian python3-torch [^)]+\)")
        self.assertIn("wrapcert::unwrap_reference", body)
        self.assertIn("LibTorch 1.13", body)

    def test_other_benchmarks_keep_their_counters(self):
        rows = table_rows(section(self.text, "Other benchmarks"))
        self.assertIn("BM_TranslateKeys/layout:0", rows)
        self.assertRegex(rows["BM_TranslateKeys/layout:0"][6], r"M items/s")
        self.assertRegex(rows["BM_BuildLayoutOnMeta/layout:1"][6], r"peak_rss_mb \d")

    @unittest.skipUnless(HAVE_MATPLOTLIB, "no matplotlib (Debian: python3-matplotlib)")
    def test_the_plot_is_drawn(self):
        text, _ = self.make_report(RECORDED, RECORDED_CONTEXT, plots=("plot.svg", "plot.png"))
        with open(self.path("plot.png"), "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(png), 10000)
        with open(self.path("plot.svg")) as f:
            svg = f.read()
        self.assertIn("<svg", svg)
        for label in ("duck-typed (Python, PyTorch)", "reference (C++)", "legacy (C++)",
                      "duck-typed (C++)", "LibTorch named_modules() walk"):
            self.assertIn(label, svg)
        self.assertIn("![time against module count, log-log](plot.png)", text)


class Intervals(unittest.TestCase):
    """The ratio interval, checked against the exact Mann-Whitney distribution computed here
    by enumeration."""

    @staticmethod
    def exact_p(x, y):
        """Two-sided exact p-value of the U statistic (no ties), by enumerating every split of
        the pooled ranks."""
        n, m = len(x), len(y)
        pooled = sorted(x + y)
        u = sum(1 for a in x for b in y if a > b)
        count_extreme, total = 0, 0
        for chosen in itertools.combinations(range(n + m), n):
            rest = [i for i in range(n + m) if i not in chosen]
            v = sum(1 for i in chosen for j in rest if pooled[i] > pooled[j])
            total += 1
            if abs(v - n * m / 2) >= abs(u - n * m / 2) - 1e-9:
                count_extreme += 1
        return count_extreme / total

    def test_the_interval_is_the_set_of_ratios_the_test_does_not_reject(self):
        a = [103.0, 97.0, 110.0, 101.0, 99.5]
        b = [51.0, 50.2, 49.0, 53.5, 48.1]
        r = bench_report.ratio(Figure(a), Figure(b))
        la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
        for factor in (0.97, 0.995, 1.005, 1.03):
            for bound, inside in ((r.low, factor > 1), (r.high, factor < 1)):
                d = math.log(bound * factor)
                accepted = self.exact_p([v - d for v in la], lb) > 0.05
                self.assertEqual(accepted, inside, (bound, factor))
        self.assertLess(r.low, r.estimate)
        self.assertLess(r.estimate, r.high)
        self.assertEqual(r.verdict, "higher")

    def test_inverse_ratio_inverts_the_interval(self):
        a, b = spread_around(200, 0.05, 6), spread_around(190, 0.05, 7)
        ab = bench_report.ratio(Figure(a), Figure(b))
        ba = bench_report.ratio(Figure(b), Figure(a))
        self.assertAlmostEqual(ab.estimate, 1 / ba.estimate)
        self.assertAlmostEqual(ab.low, 1 / ba.high)
        self.assertAlmostEqual(ab.high, 1 / ba.low)

    def test_clear_difference_is_decided_overlap_is_not(self):
        fast, slow = spread_around(100, 0.02, 9), spread_around(130, 0.02, 9)
        self.assertEqual(bench_report.ratio(Figure(slow), Figure(fast)).verdict, "higher")
        self.assertEqual(bench_report.ratio(Figure(fast), Figure(slow)).verdict, "lower")
        noisy = spread_around(115, 0.40, 9)
        r = bench_report.ratio(Figure(noisy), Figure(fast))
        self.assertEqual(r.verdict, "undecidable")
        self.assertFalse(r.too_few)
        self.assertLess(r.low, 1)
        self.assertGreater(r.high, 1)

    def test_three_repetitions_cannot_decide(self):
        r = bench_report.ratio(Figure([10, 10.1, 10.2]), Figure([20, 20.1, 20.2]))
        self.assertTrue(r.too_few)
        self.assertEqual(r.verdict, "undecidable")
        self.assertEqual((r.low, r.high), (0, math.inf))


class NoiseMarking(Workdir):
    """Made-up runs of known spread: what gets marked, and what does not."""

    def runs(self, walk_spread, load_start, cpu_share=1.0, reps=9):
        cpp = []
        for i, tree in ((0, "gemma-2b"), (1, "mistral-7b")):
            cpp += entries(f"BM_UnwrapReferenceLayout/layout:{i}",
                           spread_around(100e3, 0.01, reps), cpu_share, tree)
            cpp += entries(f"BM_NamedModulesWalkLayout/layout:{i}",
                           spread_around(80e3, walk_spread, reps), cpu_share, tree)
        for n in (100, 1000):
            cpp += entries(f"BM_UnwrapReference/modules:{n}",
                           spread_around(60.0 * n, 0.01, reps), cpu_share)
            cpp += entries(f"BM_UnwrapDuckTyped/modules:{n}",
                           spread_around(90.0 * n, 0.01, reps), cpu_share)
        python = []
        for n in (100, 1000):
            python += entries(f"BM_PythonDuckTyped/modules:{n}",
                              spread_around(6000.0 * n, 0.03, reps))
        cpp_path = self.write_json("cpp.json", {
            "context": {"libtorch_version": "1.13.1", "libtorch_threads": "2", "num_cpus": 2,
                        "load_avg": [load_start, 0.5, 0.5],
                        "layouts": "layout:0 = gemma-2b, layout:1 = mistral-7b"},
            "benchmarks": cpp})
        py_path = self.write_json("python.json", {
            "context": {"torch_version": "1.13.0a0", "torch_threads": 1, "python": "3.11",
                        "load_avg": [load_start, 0.5, 0.5], "load_avg_at_end": [1.2, 1, 1]},
            "benchmarks": python})
        ctx = self.write_json("context.json", {"cores": 2, "load_start": [load_start, 0.5, 0.5],
                                               "load_end": [1.3, 1.0, 0.8]})
        return [cpp_path, py_path], ctx

    def test_quiet_machine_clear_figures_no_warning(self):
        runs, ctx = self.runs(walk_spread=0.02, load_start=0.1)
        text, _ = self.make_report(runs, ctx)
        self.assertIsNone(section(text, "Warnings"), text)
        tables = text.split("## Context")[1]
        self.assertNotIn("undecidable", tables)
        self.assertNotIn("noisy", tables)
        rows = table_rows(section(text, "Ratios"))
        self.assertRegex(rows["gemma-2b"][1], r"^1\.2\d× \(1\.\d+–1\.\d+\)$")

    def test_a_noisy_figure_makes_its_ratio_undecidable(self):
        runs, ctx = self.runs(walk_spread=0.45, load_start=0.1)
        text, _ = self.make_report(runs, ctx)
        gemma = table_rows(section(text, "gemma-2b"))
        self.assertIn("noisy**", gemma["LibTorch named_modules() walk"][3])
        self.assertIn("**undecidable**", gemma["LibTorch named_modules() walk"][5])
        self.assertNotIn("undecidable", gemma["duck-typed (C++)"][5] if "duck-typed (C++)"
                         in gemma else "")
        warnings = section(text, "Warnings")
        self.assertIn("Undecidable ratios", warnings)
        self.assertIn("on gemma-2b", warnings)
        self.assertNotIn("machine was busy", warnings)
        # The same tree's decided ratio stays unmarked.
        small = table_rows(section(text, "synthetic tree, 100 modules"))
        self.assertNotIn("undecidable", small["duck-typed (C++)"][5])

    def test_a_busy_machine_is_warned_about(self):
        runs, ctx = self.runs(walk_spread=0.02, load_start=2.6, cpu_share=0.8)
        text, _ = self.make_report(runs, ctx)
        warnings = section(text, "Warnings")
        self.assertIsNotNone(warnings)
        self.assertRegex(warnings, r"machine was busy\*\*: load average 2\.60 at the start")
        # wall / CPU - 1 = 1 / 0.8 - 1, on the 8 C++ figures (the Python ones lost none)
        self.assertRegex(warnings, r"lost CPU time\*\*: wall time exceeded CPU time by 25% in "
                                   r"the median over figures, by more than 10% on 8 of 10")

    def test_too_few_repetitions_are_named(self):
        runs, ctx = self.runs(walk_spread=0.02, load_start=0.1, reps=3)
        text, _ = self.make_report(runs, ctx)
        self.assertIn("Few repetitions", section(text, "Warnings"))
        self.assertIn("**undecidable** (too few repetitions)", text)


class Targets(Workdir):
    """The targets table: throughput beside its Python peer, unwrap ratios, recorded times."""

    def runs(self, structural_rate):
        reps = 7
        cpp = []
        for e in entries("BM_PropertyStructural", spread_around(1e9 / structural_rate, 0.02, reps)):
            e["items_per_second"] = 1e9 / e["real_time"]
            cpp.append(e)
        for e in entries("BM_PropertyBackward/dtype:0", spread_around(1e9 / 1000, 0.02, reps),
                         label="float64"):
            e["items_per_second"] = 1e9 / e["real_time"]
            cpp.append(e)
        for e in entries("BM_PropertyTraining/dtype:2", spread_around(1e9 / 400, 0.02, reps),
                         label="bfloat16"):
            e["items_per_second"] = 1e9 / e["real_time"]
            cpp.append(e)
        # The Python peer: wall time on purpose (its work is in the worker), counters per run.
        for i, e in enumerate(entries("BM_CertifyPython/wrapper:0/iterations:1/real_time",
                                      spread_around(3e9, 0.02, reps), cpu_share=0.05,
                                      label="DataParallel")):
            e["structural_cases_per_s"] = 500.0 + i
            e["p4_cases_per_s"] = 250.0 + i
            e["p17_cases_per_s"] = 200.0 + i
            cpp.append(e)
        for i, tree in ((0, "gemma-2b"), (1, "mistral-7b")):
            cpp += entries(f"BM_UnwrapReferenceLayout/layout:{i}", spread_around(10e3, 0.01, reps),
                           label=tree)
        python = []
        for i in (0, 1):
            python += entries(f"BM_PythonDuckTypedLayout/layout:{i}",
                              spread_around(2e6, 0.01, reps))
        cpp_path = self.write_json("cpp.json", {
            "context": {"num_cpus": 2, "load_avg": [0.1, 0.1, 0.1],
                        "layouts": "layout:0 = gemma-2b, layout:1 = mistral-7b"},
            "benchmarks": cpp})
        py_path = self.write_json("python.json", {"context": {"load_avg": [0.1, 0.1, 0.1]},
                                                 "benchmarks": python})
        return [cpp_path, py_path]

    def test_each_figure_beside_its_peer_and_target(self):
        text, _ = self.make_report(self.runs(structural_rate=12_000))
        rows = table_rows(section(text, "Targets"))
        structural = next(v for k, v in rows.items() if k.startswith("structural"))
        self.assertRegex(structural[1], r"^12\.0k/s \(11\.\dk–12\.\dk, 7 reps\)$")
        self.assertIn("certify-python on torch's DataParallel", structural[2])
        # The peer's time per case over wrapcert's: 12,000 / ~503 cases a second.
        self.assertRegex(structural[3], r"^2[34]\.\d× \(")
        self.assertEqual(structural[5], "met")
        p4 = rows["P4 backward, float64"]
        self.assertRegex(p4[3], r"^3\.9\d× \(")
        self.assertEqual(p4[5], "**not met**")
        # The training loop in each dtype, beside certify-python's (about 203 cases a second).
        p17 = rows["P17 training, bfloat16"]
        self.assertRegex(p17[1], r"^400/s \(|^0\.4\d*k/s \(")
        self.assertIn("certify-python on torch's DataParallel", p17[2])
        self.assertRegex(p17[3], r"^1\.9\d× \(")
        gemma = rows["unwrap, gemma-2b: reference C++"]
        self.assertRegex(gemma[3], r"^200× \(")
        self.assertEqual(gemma[4], "≥ 150×")
        self.assertEqual(gemma[5], "met")
        # Work in other processes is not CPU time lost to a busy machine.
        self.assertIsNone(section(text, "Warnings"), text)

    def test_a_slower_run_misses_the_target(self):
        text, _ = self.make_report(self.runs(structural_rate=8_000))
        rows = table_rows(section(text, "Targets"))
        structural = next(v for k, v in rows.items() if k.startswith("structural"))
        self.assertEqual(structural[5], "**not met**")

    def test_recorded_command_times_are_rows(self):
        record = os.path.join(TOOLS, "record_times.py")
        test_times, main_times = self.path("test-times.json"), self.path("main-times.json")
        result = run(record, test_times, "--command", "scripts/test.sh", "--fresh", "true",
                     "--stage", "build=100,400", "--stage", "main suites=400,1000")
        self.assertEqual(result.returncode, 0, result.stderr)
        result = run(record, main_times, "--command", "scripts/main.sh", "--fresh", "false",
                     "--stage", "build=0,10", "--stage", "certifications=10,130")
        self.assertEqual(result.returncode, 0, result.stderr)
        text, _ = self.make_report(self.runs(12_000),
                                   extra=("--times", test_times, "--times", main_times))
        rows = table_rows(section(text, "Targets"))
        cold = rows["`scripts/test.sh`, fresh build folders"]
        self.assertRegex(cold[1], r"^15\.0 min \(build 300 s, main suites 600 s; ")
        self.assertEqual(cold[4], "≤ 20 min")
        self.assertEqual(cold[5], "met")
        main = rows["main job (`scripts/main.sh`)"]
        self.assertRegex(main[1], r"^2\.2 min \(build 10 s, certifications 120 s; ")
        self.assertEqual(main[5], "met")

    def large_tree_report(self, spinners, python_ms):
        """A run of the 60,000-module tree (the C++ reference at 20 ms), and its context: quiet,
        or with `spinners` spinning processes beside it (`scripts/bench.sh --busy`)."""
        reps = 7
        cpp = entries("BM_UnwrapReference/modules:60000", spread_around(20e6, 0.01, reps))
        python = entries("BM_PythonDuckTyped/modules:60000",
                         spread_around(python_ms * 1e6, 0.01, reps))
        runs = [self.write_json("cpp.json", {"context": {"num_cpus": 2,
                                                         "load_avg": [0.1, 0.1, 0.1]},
                                             "benchmarks": cpp}),
                self.write_json("python.json", {"context": {"load_avg": [1.6, 0.9, 0.4]},
                                                "benchmarks": python})]
        ctx = {"cores": 2, "load_start": [0.1, 0.1, 0.1], "load_end": [2.3, 1.2, 0.6]}
        if spinners is not None:
            ctx["busy_spinners"] = spinners
        text, _ = self.make_report(runs, self.write_json("context.json", ctx))
        return text, table_rows(section(text, "Targets"))

    def test_the_large_tree_target_is_decided_by_a_busy_run_alone(self):
        text, rows = self.large_tree_report(spinners=1, python_ms=800)
        row = rows["unwrap, synthetic tree, 60,000 modules, other core(s) busy (1 spinner(s)): "
                   "reference C++"]
        self.assertRegex(row[3], r"^40\.0× \(")
        self.assertEqual(row[4], "≥ 30×")
        self.assertEqual(row[5], "met")
        self.assertIn("1 spinning process(es) beside the runs (`--busy`)",
                      table_rows(section(text, "Context"))["load"][1])
        warnings = section(text, "Warnings")
        self.assertIn("**Busy on purpose**", warnings)
        # The spinner's own load (1.6 when Python started, 2.3 at the end with the benchmark's)
        # is not "busy".
        self.assertNotIn("machine was busy", warnings)
        _, rows = self.large_tree_report(spinners=1, python_ms=500)
        slow = next(v for k, v in rows.items() if "60,000 modules" in k)
        self.assertEqual(slow[5], "**not met**")
        # Quiet, the same ratio decides nothing: the target is set for a loaded machine.
        text, rows = self.large_tree_report(spinners=None, python_ms=800)
        quiet = rows["unwrap, synthetic tree, 60,000 modules, quiet machine: reference C++"]
        self.assertRegex(quiet[3], r"^40\.0× \(")
        self.assertEqual(quiet[5], "– (set for a busy machine: `scripts/bench.sh --busy`)")
        self.assertNotIn("Busy on purpose", text)

    def test_load_beyond_the_spinners_is_still_busy(self):
        self.large_tree_report(spinners=1, python_ms=800)
        with open(self.path("context.json")) as f:
            ctx = json.load(f)
        ctx["load_end"] = [3.4, 2.0, 1.0]  # the benchmark, 1 spinner, and 1.4 of someone else's
        text, _ = self.make_report([self.path("cpp.json"), self.path("python.json")],
                                   self.write_json("context.json", ctx))
        warnings = section(text, "Warnings")
        self.assertIn("**Busy on purpose**", warnings)
        self.assertRegex(warnings, r"machine was busy\*\*: load average 3\.40 at the end, on 2 "
                                   r"core\(s\) \(more than 0\.5 per core besides the benchmark "
                                   r"and the spinners\)")
        # Before the spinners started, all the load is someone else's: 1.6 is busy.
        ctx["load_end"] = [2.3, 1.2, 0.6]
        ctx["load_start"] = [1.6, 1.0, 1.0]
        text, _ = self.make_report([self.path("cpp.json"), self.path("python.json")],
                                   self.write_json("context.json", ctx))
        self.assertRegex(section(text, "Warnings"),
                         r"machine was busy\*\*: load average 1\.60 at the start, on 2 ")

    def test_a_record_is_never_written_through_a_link(self):
        target = self.path("elsewhere.json")
        with open(target, "w") as f:
            f.write("kept")
        link = self.path("test-times.json")
        os.symlink(target, link)
        result = run(os.path.join(TOOLS, "record_times.py"), link, "--command", "scripts/test.sh",
                     "--fresh", "true", "--stage", "build=0,1")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("not a regular file", result.stderr)
        with open(target) as f:
            self.assertEqual(f.read(), "kept")
        self.assertTrue(os.path.islink(link))


class Plot(Workdir):
    def test_without_matplotlib_the_report_is_still_written(self):
        blocker = self.path("block")
        os.mkdir(blocker)
        with open(os.path.join(blocker, "sitecustomize.py"), "w") as f:
            f.write("import sys\nsys.modules['matplotlib'] = None\n")
        env = dict(os.environ, PYTHONPATH=blocker)
        result = subprocess.run([sys.executable, REPORT, *RECORDED, "--markdown",
                                 self.path("report.md"), "--plot", self.path("plot.png")],
                                capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("no matplotlib", result.stderr)
        self.assertFalse(os.path.exists(self.path("plot.png")))
        with open(self.path("report.md")) as f:
            text = f.read()
        self.assertIn("No plot: no matplotlib (Debian: apt-get install python3-matplotlib)", text)
        self.assertIsNotNone(section(text, "gemma-2b"))

    @unittest.skipUnless(HAVE_MATPLOTLIB, "no matplotlib (Debian: python3-matplotlib)")
    def test_svg_and_png_are_written_and_not_empty(self):
        self.make_report(RECORDED, plots=("plot.svg", "plot.png"))
        for name in ("plot.svg", "plot.png"):
            self.assertGreater(os.path.getsize(self.path(name)), 1000, name)


class CompareGate(Workdir):
    """tools/bench_compare.py on the recorded pairs, and its table in the report."""

    def compare(self, contender):
        md = self.path(f"{contender}.md")
        result = run(COMPARE, os.path.join(DATA, "baseline.json"),
                     os.path.join(DATA, f"{contender}.json"), "--markdown", md)
        with open(md) as f:
            return result, f.read()

    def test_unchanged_runs_pass(self):
        result, md = self.compare("same")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertNotIn("REGRESSION", result.stdout)
        self.assertIn("no benchmark slower by more than 10%", md)

    def test_a_significant_regression_fails_and_names_the_benchmark(self):
        result, md = self.compare("slower")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        flagged = [line.split()[0] for line in result.stdout.splitlines() if "REGRESSION" in line]
        self.assertEqual(flagged, ["BM_UnwrapReference/modules:1000"])
        rows = table_rows(md)
        self.assertEqual(rows["BM_UnwrapReference/modules:1000"][5], "**REGRESSION**")
        self.assertRegex(rows["BM_UnwrapReference/modules:1000"][3], r"^\+2[45]\.\d%$")
        self.assertEqual(rows["BM_TranslateKeys/layout:0"][5], "no significant change")

    def test_the_table_goes_into_the_report(self):
        _, md = self.compare("slower")
        text, _ = self.make_report(RECORDED, extra=("--section", "Compared with old",
                                                    self.path("slower.md")))
        body = section(text, "Compared with old")
        self.assertIn("**REGRESSION**", body)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[1:], verbosity=2)
