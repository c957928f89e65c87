#!/usr/bin/python3
"""Tests of scripts/study: the interval formula on known cases, the Pareto frontier, the paired
difference, that a second invocation skips the runs already finished (resume), and that studies
sharing a folder do not run one run twice."""
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
loader = importlib.machinery.SourceFileLoader("study", os.path.join(ROOT, "scripts", "study"))
spec = importlib.util.spec_from_loader("study", loader)
study = importlib.util.module_from_spec(spec)
loader.exec_module(study)


class Interval(unittest.TestCase):
    def test_identical_seeds_leave_only_the_binomial_error(self):
        mean, half, sd = study.interval([0.5] * 5, 2000)
        self.assertAlmostEqual(mean, 0.5)
        self.assertAlmostEqual(sd, 0.0)
        self.assertAlmostEqual(half, 1.96 * (0.25 / 2000) ** 0.5, places=12)  # 0.0219

    def test_seed_spread_and_binomial_error_add_in_quadrature(self):
        values = [0.30, 0.32, 0.34, 0.36, 0.38]  # mean 0.34, sd 0.0316
        mean, half, sd = study.interval(values, 1000)
        self.assertAlmostEqual(mean, 0.34)
        self.assertAlmostEqual(sd, 0.0316228, places=6)
        seed_half = 2.776 * 0.0316228 / 5 ** 0.5
        binomial_half = 1.96 * (0.34 * 0.66 / 1000) ** 0.5
        self.assertAlmostEqual(half, (seed_half ** 2 + binomial_half ** 2) ** 0.5, places=6)

    def test_one_seed_has_no_finite_interval(self):
        self.assertEqual(study.interval([0.4], 2000)[1], float("inf"))

    def test_t_quantiles(self):
        self.assertAlmostEqual(study.t975(4), 2.776)
        self.assertAlmostEqual(study.t975(11), 2.179)  # between table entries: the next larger df's (conservative)
        self.assertAlmostEqual(study.t975(1000), 1.96)


class Comparisons(unittest.TestCase):
    def test_paired_difference_cancels_what_the_seeds_share(self):
        a = {1: 0.40, 2: 0.50, 3: 0.60}
        b = {1: 0.38, 2: 0.48, 3: 0.58, 4: 0.9}  # seed 4 has no partner
        d, half, n = study.paired(a, b)
        self.assertAlmostEqual(d, 0.02)
        self.assertAlmostEqual(half, 0.0, places=12)
        self.assertEqual(n, 3)

    def test_pareto_frontier(self):
        points = [(10, 0.5), (5, 0.4), (5, 0.45), (20, 0.49), (1, 0.1)]
        self.assertEqual(study.pareto(points), [4, 2, 0])  # (5, 0.4) and (20, 0.49) are dominated


class Curves(unittest.TestCase):
    def test_the_plateau_and_the_step_that_reaches_it(self):
        curve = [(25, 0.50), (50, 0.70), (75, 0.74), (100, 0.76), (125, 0.77), (150, 0.77), (175, 0.76), (200, 0.75)]
        plateau, step = study.plateau_step(curve)  # plateau: the last quarter, at least 3 evaluations
        self.assertAlmostEqual(plateau, (0.77 + 0.76 + 0.75) / 3)
        self.assertEqual(step, 125, "trailing means: 100 0.733 (not within 0.01 of 0.76), 125 0.757")

    def test_a_curve_that_never_comes_within_a_point_ends_at_its_last_step(self):
        self.assertEqual(study.plateau_step([(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9)], within=0.0)[1], 4)


class Channels(unittest.TestCase):
    def test_equal_bytes_are_checked_per_seed(self):
        rows = [dict(task="wordnet", label=l, seed=s, train_mb=mb)
                for l, s, mb in [("a", 1, 100.4), ("b", 1, 100.0), ("a", 2, 100.6), ("b", 2, 100.0), ("a", 3, 99.0)]]
        lines = study.bytes_match({"equal_bytes": [["a", "b", 0.005]]}, rows)
        self.assertIn("| wordnet | a | b | 1 | +0.40% | yes (+-0.5%) |", lines)
        self.assertIn("| wordnet | a | b | 2 | +0.60% | NO (+-0.5%) |", lines)
        self.assertFalse(any("| 3 |" in l for l in lines), "seed 3 has no b to compare with")

    def test_the_largest_channels_widths_are_listed_by_seed(self):
        with tempfile.TemporaryDirectory() as out:
            os.makedirs(os.path.join(out, "channels"))
            rows = []
            for seed, outlier_bits in [(1, 8), (2, 7)]:
                rows.append(dict(task="wordnet", label="amaq:budget=3", method="amaq:budget=3", seed=seed))
                with open(os.path.join(out, "channels", f"wordnet__amaq_budget=3__s{seed}.csv"), "w") as f:
                    f.write("channel,bits,min,max,range,mean,stddev,kurtosis,mean_abs_gradient\n")
                    for c in range(5):  # channel 3 is 100 times the others
                        big = 100.0 if c == 3 else 1.0
                        f.write(f"{c},{outlier_bits if c == 3 else 3},{-big},{big},{2 * big},0,1,0,0.1\n")
            lines = study.largest_channels(out, rows, count=2)
        self.assertEqual(lines[4], "| wordnet | amaq:budget=3 | 3 | 100.0 (100.0x) | 8 / 7 | 3 / 3 |")


FAKE_RUN = textwrap.dedent("""\
    #!/usr/bin/python3
    # Stands in for amaq-study: writes a result and counts its invocations (and their niceness).
    import json, os, sys
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    with open(args["counter"], "a") as f:
        f.write(args["method"] + " " + args["seed"] + "\\n")
    with open(args["counter"] + ".nice", "a") as f:
        f.write(str(os.nice(0)) + "\\n")
    result = dict(task=args["task"], method=args["method"], seed=int(args["seed"]), steps=8, eval_split="report",
                  eval_examples=100, metric=0.3 + 0.01 * int(args["seed"]), correct=30, bits_mean=4.0, bits_q1=8,
                  bits_q2=4, bits_q3=3, bits_q4=3, bits_last_quarter=3.0, train_bytes_up=1000, train_bytes_down=900,
                  eval_bytes=10, loss_first=2.0, loss_last=1.0, loss_max_second_half=1.2, seconds=0.1,
                  build=dict(commit=args.get("commit", "c0"), dirty=False, libtorch="2.13.0", compiler="gcc 12",
                             cpu="test CPU"))
    with open(args["out"], "w") as f:
        json.dump(result, f)
""")


def fake_program(folder):
    """Writes FAKE_RUN into folder as an executable; returns its path and that of its call log."""
    fake = os.path.join(folder, "fake-run")
    with open(fake, "w") as f:
        f.write(FAKE_RUN)
    os.chmod(fake, 0o755)
    return fake, os.path.join(folder, "calls")


def write_grid(folder, fake, counter, rest, name="t"):
    """Writes folder/<name>.yaml, a WordNet grid of `fake` logging its calls to `counter`, with the
    YAML lines `rest` (methods, seeds, ...); returns its path."""
    path = os.path.join(folder, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"name: {name}\nprogram: {fake}\nsettings: {{counter: {counter}}}\ntasks: {{wordnet: {{}}}}\n" + rest)
    return path


class Resume(unittest.TestCase):
    def test_a_second_invocation_skips_finished_runs(self):
        with tempfile.TemporaryDirectory() as d:
            fake, counter = fake_program(d)
            grid = write_grid(d, fake, counter, "methods: [bf16, 'fixed:3:channel']\nseeds: [1, 2]\n"
                                                "compare: [[bf16, 'fixed:3:channel']]\n")
            out = os.path.join(d, "out")
            command = [os.path.join(ROOT, "scripts", "study"), grid, "--out", out, "--jobs", "2"]
            subprocess.run(command, check=True, capture_output=True)
            with open(counter) as f:
                self.assertEqual(len(f.readlines()), 4)
            with open(counter + ".nice") as f:
                self.assertEqual(set(f.read().split()), {str(min(19, os.nice(0) + 10))}, "runs at lower priority")
            os.remove(os.path.join(out, "runs", "wordnet__bf16__s2.json"))  # one run lost
            subprocess.run(command + ["--report"], check=True, capture_output=True)
            with open(os.path.join(out, "report.md")) as f:
                self.assertIn("1 of the grid's 4 runs are not finished: wordnet__bf16__s2.", f.read())
            with open(counter) as f:
                self.assertEqual(len(f.readlines()), 4, "--report runs nothing")
            second = subprocess.run(command, check=True, capture_output=True, text=True)
            with open(counter) as f:
                calls = f.read().split("\n")
            self.assertEqual([c for c in calls if c][4:], ["bf16 2"], "only the missing run runs again")
            self.assertIn("3 already done, 1 to run", second.stdout)
            with open(os.path.join(out, "results.csv")) as f:
                self.assertEqual(len(f.readlines()), 5)  # header + 4 runs
            self.assertTrue(os.path.exists(os.path.join(out, "frontier-wordnet.png")))
            with open(os.path.join(out, "report.md")) as f:
                text = f.read()
            self.assertIn("| bf16 | fixed:3:channel | +0.0000 |", text)
            self.assertIn("None: all 4 runs of the grid are finished.", text)

    def test_a_run_another_study_holds_is_skipped(self):
        with tempfile.TemporaryDirectory() as d:
            fake, counter = fake_program(d)
            grid = write_grid(d, fake, counter, "methods: [bf16]\nseeds: [1, 2]\n")
            out = os.path.join(d, "out")
            os.makedirs(os.path.join(out, "logs"))
            with open(os.path.join(out, "logs", "wordnet__bf16__s1.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # as a second study running that run holds it
                run = subprocess.run([os.path.join(ROOT, "scripts", "study"), grid, "--out", out], check=True,
                                     capture_output=True, text=True)
            self.assertIn("wordnet__bf16__s1: skipped, another study sharing", run.stdout)
            with open(counter) as f:
                self.assertEqual([c for c in f.read().split("\n") if c], ["bf16 2"], "only the run nobody held ran")
            self.assertFalse(os.path.exists(os.path.join(out, "runs", "wordnet__bf16__s1.json")))

    def test_included_folders_count_as_done_and_are_reported(self):
        with tempfile.TemporaryDirectory() as d:
            fake, counter = fake_program(d)
            first = write_grid(d, fake, counter, "methods: [bf16]\nseeds: [1, 2]\n", name="a")
            out_a, out_b = os.path.join(d, "a"), os.path.join(d, "b")
            subprocess.run([os.path.join(ROOT, "scripts", "study"), first, "--out", out_a], check=True,
                           capture_output=True)
            second = write_grid(d, fake, counter, f"methods: [bf16, 'fixed:3:channel']\nseeds: [1, 2]\ninclude: [{out_a}]\n"
                                                  "compare: [[bf16, 'fixed:3:channel']]\n", name="b")
            run = subprocess.run([os.path.join(ROOT, "scripts", "study"), second, "--out", out_b], check=True,
                                 capture_output=True, text=True)
            self.assertIn("2 already done, 2 to run", run.stdout)
            with open(counter) as f:
                self.assertEqual(sorted(c for c in f.read().split("\n") if c),
                                 ["bf16 1", "bf16 2", "fixed:3:channel 1", "fixed:3:channel 2"], "bf16 ran once, in a")
            with open(os.path.join(out_b, "results.csv")) as f:
                self.assertEqual(len(f.readlines()), 5)  # header + the 2 included and the 2 new runs
            with open(os.path.join(out_b, "report.md")) as f:
                self.assertIn("| bf16 | fixed:3:channel |", f.read())
            missing = os.path.join(d, "missing.yaml")
            with open(missing, "w") as f:
                f.write(f"name: c\nprogram: {fake}\ntasks: {{wordnet: {{}}}}\nmethods: [bf16]\nseeds: [1]\n"
                        f"include: [{os.path.join(d, 'nowhere')}]\n")
            refused = subprocess.run([os.path.join(ROOT, "scripts", "study"), missing, "--out", out_b],
                                     capture_output=True, text=True)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("has no runs/ folder: run that study first", refused.stderr)


class Builds(unittest.TestCase):
    def test_pairs_of_runs_from_two_commits_are_refused_unless_asked_and_then_listed(self):
        with tempfile.TemporaryDirectory() as d:
            fake, counter = fake_program(d)
            grid = os.path.join(d, "grid.yaml")
            with open(grid, "w") as f:  # fixed:3:channel's runs name another commit than bf16's
                f.write(f"name: t\nprogram: {fake}\nsettings: {{counter: {counter}, commit: c1}}\n"
                        "tasks: {wordnet: {}}\nseeds: [1, 2]\ncompare: [[bf16, 'fixed:3:channel']]\n"
                        "methods: [bf16, {method: 'fixed:3:channel', settings: {commit: c2}}]\n")
            out = os.path.join(d, "out")
            command = [os.path.join(ROOT, "scripts", "study"), grid, "--out", out]
            refused = subprocess.run(command, capture_output=True, text=True)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("wordnet: bf16 - fixed:3:channel: c1, c2", refused.stderr)
            with open(os.path.join(out, "results.csv")) as f:
                self.assertIn("c2,2.13.0,gcc 12,test CPU", f.read(), "each run's build is in results.csv")
            marked = subprocess.run(command + ["--mixed-builds"], check=True, capture_output=True, text=True)
            self.assertIn("| bf16 | fixed:3:channel (runs of several commits) |", marked.stdout)
            self.assertIn("| c1 | 2.13.0 | gcc 12 | test CPU | 2 |", marked.stdout)


if __name__ == "__main__":
    unittest.main()
