#!/usr/bin/python3
"""report_test.py: scripts/report describes what it was given and reports each client's final
evaluation, on a user's own CSVs (no demo.json, no timings) as on a demo's."""
import csv
import json
import os
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = os.path.join(ROOT, "scripts", "report")
COLUMNS = ["client", "method", "step", "wire_up_bytes", "wire_down_bytes", "up_payload_bytes", "up_metadata_bytes",
           "down_payload_bytes", "down_metadata_bytes", "loss", "average_bits", "metric", "seconds", "applied", "run", "server"]


def write_run(run, method, client, evaluations, path=None, label="2026-12-07T01:00:00.000Z"):
    """Four training steps, then evaluations [(step, metric)], as amaq-client writes its CSV (a run
    appended to `path` when it exists)."""
    path = path or os.path.join(run, f"{client}.csv" if method == "bf16" else f"small-{client}.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        if new:
            w.writeheader()
        per_step = 1_000_000 if method == "bf16" else 250_000
        for step in range(1, 5):  # steps done
            w.writerow(dict(client=client, method=method, step=step, wire_up_bytes=per_step * step,
                            wire_down_bytes=per_step * step, up_payload_bytes=0, up_metadata_bytes=0,
                            down_payload_bytes=0, down_metadata_bytes=0, loss=3.5 - step * 0.5,
                            average_bits=16 if method == "bf16" else 4, metric="", seconds=0.1, applied=1, run=label))
        for step, metric in evaluations:
            w.writerow(dict(client=client, method=method, step=step, wire_up_bytes=per_step * 5, wire_down_bytes=per_step * 5,
                            up_payload_bytes=0, up_metadata_bytes=0, down_payload_bytes=0, down_metadata_bytes=0,
                            loss=1.5, average_bits=16 if method == "bf16" else 4, metric=metric, seconds=0, applied=1,
                            run=label))


class Report(unittest.TestCase):
    def setUp(self):
        self.run = tempfile.mkdtemp(prefix="amaq-report-")
        write_run(self.run, "bf16", "client-1", [(2, 0.1), (4, 0.05)])  # an intermediate evaluation, then the final
        write_run(self.run, "fixed:3:channel", "client-1", [(4, 0.04)])

    def report(self, *flags):
        out = subprocess.run([REPORT, *flags, self.run], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(os.path.join(self.run, "report.md")) as f:
            return out.stdout, f.read()

    def row(self, stdout, method):
        return next(line for line in stdout.splitlines() if line.startswith(f"| {method} |")).split("|")[1:-1]

    def test_a_users_own_csvs(self):
        stdout, markdown = self.report()
        for text in (stdout, markdown):
            self.assertNotIn("nan", text.lower())
        bf16 = [c.strip() for c in self.row(stdout, "bf16")]
        self.assertEqual(bf16[1], "4", "steps trained")
        self.assertEqual(bf16[7], "0.050", "the final evaluation, not the mean of 0.1 and 0.05")
        fixed = [c.strip() for c in self.row(stdout, "fixed:3:channel")]
        self.assertEqual(fixed[4], "4.0", "x fewer bytes than bf16")
        self.assertEqual(fixed[9], "-", "no timings: no wall time")
        self.assertNotIn("WordNet", markdown, "a user's run is not described as the demo")
        self.assertIn("bf16, fixed:3:channel", markdown)
        self.assertIn("without an interval", markdown)
        self.assertTrue(os.path.exists(os.path.join(self.run, "accuracy_vs_mb.png")))

    def test_a_demos_run_says_what_it_ran(self):
        with open(os.path.join(self.run, "demo.json"), "w") as f:
            json.dump({"task": "WordNet noun topics (25 classes)", "server_lora": "one shared server LoRA",
                       "eval_examples": 200, "steps": 4, "clients": 1}, f)
        stdout, markdown = self.report()
        self.assertIn("WordNet noun topics (25 classes), 1 clients", markdown)
        self.assertIn("evaluated on 200 validation examples", markdown)
        self.assertIn("0.050 +- 0.030", stdout)  # 1.96 * sqrt(0.05 * 0.95 / 200)

    def test_runs_in_one_csv_stay_apart(self):
        # A --fresh run appended to client-1.csv (issue 55: the merge reported 0.380 where the
        # last evaluation was 0.125): the last run alone, unless --all-runs.
        write_run(self.run, "bf16", "client-1", [(4, 0.125)], path=os.path.join(self.run, "client-1.csv"),
                  label="2026-12-07T02:00:00.000Z")
        stdout, markdown = self.report()
        bf16 = [c.strip() for c in self.row(stdout, "bf16")]
        self.assertEqual(bf16[7], "0.125", "the last run's final evaluation")
        self.assertEqual(bf16[2], "4.00", "the last run's training megabytes, not the sum of two runs")
        self.assertIn("1 earlier run(s) in the same CSVs are left out", markdown)
        stdout, _ = self.report("--all-runs")
        self.assertEqual(self.row(stdout, "bf16 (run 2026-12-07T01:00:00.000Z)")[7].strip(), "0.050")
        self.assertEqual(self.row(stdout, "bf16 (run 2026-12-07T02:00:00.000Z)")[7].strip(), "0.125")

    def test_a_quickstart_folder(self):
        # scripts/quickstart writes runs/client-1.csv and client-1/adapter under its folder.
        quick = tempfile.mkdtemp(prefix="amaq-quickstart-")
        os.makedirs(os.path.join(quick, "runs"))
        os.makedirs(os.path.join(quick, "client-1", "adapter"))
        write_run(quick, "amaq:8->2:budget=3", "client-1", [(4, 0.3)], path=os.path.join(quick, "runs", "client-1.csv"))
        out = subprocess.run([REPORT, quick], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        row = [c.strip() for c in next(l for l in out.stdout.splitlines() if l.startswith("| amaq")).split("|")[1:-1]]
        self.assertEqual(row[7], "0.300")
        self.assertEqual(row[10], os.path.join("client-1", "adapter"))

    def test_a_folder_without_client_csvs_says_where_to_point_it(self):
        empty = tempfile.mkdtemp(prefix="amaq-empty-")
        with open(os.path.join(empty, "other.csv"), "w") as f:
            f.write("a,b\n1,2\n")
        out = subprocess.run([REPORT, empty], capture_output=True, text=True)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("no amaq-client CSVs", out.stderr)


if __name__ == "__main__":
    unittest.main()
