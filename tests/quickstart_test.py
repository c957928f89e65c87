#!/usr/bin/python3
"""quickstart_test.py: the README's "Running it yourself" works verbatim.

Runs scripts/quickstart into a new folder, then the server and client commands it prints, exactly
as printed, from an empty working directory: the client finishes its steps over TLS with its token,
writes its CSV and adapter inside the folder, the server stops cleanly on SIGTERM with its
checkpoint inside the folder, and nothing is written anywhere else (the working directory stays
empty). A run interrupted with Ctrl-C (SIGINT) says so and continues with the same command; --fresh starts
it over. Then the mistakes a first user makes: a folder that is not empty is refused, and a server
whose tokens file is missing stops before it writes its checkpoint folder.
"""
import csv as csvlib  # `csv` names a CSV's path below
import io
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "scripts", "quickstart")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(path):
    with open(path) as f:
        return f.read()


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Quickstart(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="amaq-quickstart-")
        self.dir = os.path.join(self.work, "first-run")
        self.cwd = os.path.join(self.work, "cwd")
        os.mkdir(self.cwd)
        self.quickstart(self.dir, steps=3)

    def quickstart(self, dir, steps):
        """Runs scripts/quickstart into dir; keeps the two commands it prints."""
        self.port = free_port()
        out = subprocess.run([QUICKSTART, dir, "--port", str(self.port), "--metrics_port", str(free_port()),
                              "--steps", str(steps), "--eval_examples", "8"], capture_output=True, text=True, cwd=self.cwd)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.printed = out.stdout
        commands = [line.strip() for line in out.stdout.splitlines() if line.startswith("  ")]
        self.assertEqual(len(commands), 2, out.stdout)
        self.server_command, self.client_command = commands
        self.assertIn("amaq-server --config", self.server_command)
        self.assertIn("amaq-client --config", self.client_command)

    def start_server(self, log):
        server = subprocess.Popen(shlex.split(self.server_command), cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: server.poll() is None and server.kill())
        return server

    def wait_listening(self, server, log):
        deadline = time.monotonic() + 120
        while not listening(self.port):
            self.assertIsNone(server.poll(), "the server stopped: " + read(log.name))
            self.assertLess(time.monotonic(), deadline, "the server did not listen within 120 s")
            time.sleep(0.2)

    def run_client(self, *extra):
        return subprocess.run(shlex.split(self.client_command) + list(extra), cwd=self.cwd, capture_output=True,
                              text=True, timeout=540)

    def test_the_printed_commands_run_as_printed(self):
        with open(os.path.join(self.work, "server.log"), "w+") as log:
            server = self.start_server(log)
            self.wait_listening(server, log)
            client = self.run_client()
            self.assertEqual(client.returncode, 0, client.stdout + client.stderr)
            self.assertIn("client client-1", client.stdout)
            self.assertIn("steps 3", client.stdout)
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=60), 0, read(log.name))
        with open(os.path.join(self.dir, "runs", "client-1.csv")) as csv:
            rows = csv.read().splitlines()
        self.assertEqual(len(rows), 1 + 3 + 1, rows)  # the header, three steps, the final evaluation
        self.assertTrue(os.listdir(os.path.join(self.dir, "client-1", "adapter")))
        self.assertTrue(os.listdir(os.path.join(self.dir, "server")))
        self.assertEqual(os.listdir(self.cwd), [], "written outside the quickstart's folder")

    def test_an_interrupted_run_continues_and_fresh_starts_over(self):
        """Ctrl-C in the client's terminal, then the same command, then the same command with --fresh."""
        self.quickstart(os.path.join(self.work, "interrupted"), steps=40)
        csv = os.path.join(self.work, "interrupted", "runs", "client-1.csv")
        with open(os.path.join(self.work, "server.log"), "w+") as log:
            server = self.start_server(log)
            self.wait_listening(server, log)
            client = subprocess.Popen(shlex.split(self.client_command), cwd=self.cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 300
            while not (os.path.exists(csv) and len(read(csv).splitlines()) >= 1 + 3):
                self.assertIsNone(client.poll(), client.stdout.read() if client.poll() is not None else "")
                self.assertLess(time.monotonic(), deadline, "the client made no 3 steps within 300 s")
                time.sleep(0.1)
            client.send_signal(signal.SIGINT)
            said = client.communicate(timeout=120)[0]
            self.assertEqual(client.returncode, 130, said)
            done = len(read(csv).splitlines()) - 1
            self.assertIn(f"interrupted at step {done}: run the same command to continue", said)

            again = self.run_client()
            self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
            self.assertIn(f"restored its checkpoint of step {done}", again.stdout + again.stderr)
            self.assertIn("steps 40", again.stdout)

            fresh = self.run_client("--fresh")
            self.assertEqual(fresh.returncode, 0, fresh.stdout + fresh.stderr)
            self.assertIn("fresh:", fresh.stdout + fresh.stderr)
            self.assertNotIn("restored its checkpoint", fresh.stdout + fresh.stderr)
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=60), 0, read(log.name))
        # One CSV, two runs told apart by its run column: the interrupted run continued under one
        # label, the fresh run under another; scripts/report on the folder reports the fresh one.
        rows = list(csvlib.DictReader(io.StringIO(read(csv))))
        runs = [r["run"] for r in rows]
        self.assertEqual(len(set(runs)), 2, runs)
        self.assertEqual({r["server"] for r in rows}, {f"localhost:{self.port}"}, "the server that answered each row")
        self.assertEqual(runs.count(runs[-1]), 40 + 1, "the fresh run: 40 steps and its evaluation")
        report = subprocess.run([os.path.join(ROOT, "scripts", "report"), os.path.join(self.work, "interrupted")],
                                capture_output=True, text=True)
        self.assertEqual(report.returncode, 0, report.stderr)
        row = next(line for line in report.stdout.splitlines() if line.startswith("| fixed:3:channel"))
        self.assertEqual(row.split("|")[2].strip(), "40", row)
        self.assertIn(os.path.join("client-1", "adapter"), row)
        self.assertIn("1 earlier run(s)", read(os.path.join(self.work, "interrupted", "report.md")))

    def test_help_helps_and_an_option_for_the_folder_is_refused(self):
        for script in ("quickstart", "demo"):
            shown = subprocess.run([os.path.join(ROOT, "scripts", script), "--help"], capture_output=True, text=True)
            self.assertEqual(shown.returncode, 0, shown.stderr)
            self.assertIn("--steps", shown.stdout, script)
        misplaced = subprocess.run([os.path.join(ROOT, "scripts", "quickstart"), "--port", "1", "x"], capture_output=True,
                                   text=True)
        self.assertEqual(misplaced.returncode, 2)
        self.assertIn("the folder comes first", misplaced.stderr)

    def test_a_folder_that_is_not_empty_is_refused(self):
        out = subprocess.run([QUICKSTART, self.dir], capture_output=True, text=True, cwd=self.cwd)
        self.assertEqual(out.returncode, 1)
        self.assertIn("is not empty", out.stderr)

    def test_the_server_checks_its_files_before_it_writes(self):
        os.remove(os.path.join(self.dir, "certs", "tokens"))
        with open(os.path.join(self.work, "server.log"), "w+") as log:
            server = self.start_server(log)
            self.assertNotEqual(server.wait(timeout=120), 0)
            self.assertIn("tokens file not found", read(log.name))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "server")), "the checkpoint folder was made first")


if __name__ == "__main__":
    unittest.main()
