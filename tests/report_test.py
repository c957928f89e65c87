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
           "down_payload_bytes", "down_metadata_bytes", "loss", "average_bits", "metric", "seconds", "applied"]


def write_run(run, method, client, evaluations):
    """Four training steps, then evaluations [(step, metric)], as amaq-client writes its CSV."""
    with open(os.path.join(run, f"{client}.csv" if method == "bf16" else f"small-{client}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        per_step = 1_000_000 if method == "bf16" else 250_000
        for step in range(1, 5):  # steps done
            w.writerow(dict(client=client, method=method, step=step, wire_up_bytes=per_step * step,
                            wire_down_bytes=per_step * step, up_payload_bytes=0, up_metadata_bytes=0,
                            down_payload_bytes=0, down_metadata_bytes=0, loss=3.5 - step * 0.5,
                            average_bits=16 if method == "bf16" else 4, metric="", seconds=0.1, applied=1))
        for step, metric in evaluations:
            w.writerow(dict(client=client, method=method, step=step, wire_up_bytes=per_step * 5, wire_down_bytes=per_step * 5,
                            up_payload_bytes=0, up_metadata_bytes=0, down_payload_bytes=0, down_metadata_bytes=0,
                            loss=1.5, average_bits=16 if method == "bf16" else 4, metric=metric, seconds=0, applied=1))


class Report(unittest.TestCase):
    def setUp(self):
        self.run = tempfile.mkdtemp(prefix="amaq-report-")
        write_run(self.run, "bf16", "client-1", [(2, 0.1), (4, 0.05)])  # an intermediate evaluation, then the final
        write_run(self.run, "fixed:3:channel", "client-1", [(4, 0.04)])

    def report(self):
        out = subprocess.run([REPORT, self.run], capture_output=True, text=True)
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


if __name__ == "__main__":
    unittest.main()
