#!/usr/bin/python3
"""programs_test.py BIN_DIR: every amaq program takes its settings one way (docs/configuration.md).

For each program: its `--help` is in docs/configuration.md verbatim; an unknown key exits with
code 2 naming the key; a missing --config file exits with code 2 naming the file; a config file's
keys are read (a bad value in it is refused by key and file). And amaq-generate's own checks:
no prompt, top_k without a temperature, an empty prompt on standard input: each code 2. And
amaq-server's refusals at start: no TLS files, metrics_tls without them, a TLS file that is absent;
and two servers as a replica set (they meet, average their shared LoRA, refuse a third of another run).
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin")
PROGRAMS = ["amaq-server", "amaq-client", "amaq-netem", "amaq-generate", "amaq-finetune", "amaq-pretrain", "amaq-convert"]
# A key each program has, and a value outside what it allows.
BAD_VALUE = {"amaq-server": ("threads", "-1"), "amaq-client": ("steps", "-1"), "amaq-netem": ("log_level", "loud"),
             "amaq-generate": ("max_new_tokens", "0"), "amaq-finetune": ("task", "chess"),
             "amaq-pretrain": ("tokens", "4096"), "amaq-convert": ("log_level", "loud")}


def run(program, *args, stdin=""):
    return subprocess.run([os.path.join(BIN, program), *args], input=stdin, capture_output=True, text=True, timeout=120)


class Programs(unittest.TestCase):
    def test_each_program_takes_its_settings_the_same_way(self):
        with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
            docs = f.read()
        work = tempfile.mkdtemp(prefix="amaq-programs-")
        for program in PROGRAMS:
            with self.subTest(program=program):
                shown = run(program, "--help")
                self.assertEqual(shown.returncode, 0, shown.stderr)
                self.assertIn(shown.stdout.rstrip("\n"), docs, f"docs/configuration.md is stale: paste `{program} --help`")
                version = run(program, "--version")
                self.assertEqual(version.returncode, 0, version.stdout + version.stderr)
                self.assertRegex(version.stdout, f"^{program} built from commit ([0-9a-f]{{40}}|unknown)( with local changes)?\n$")
                unknown = run(program, "--colour", "red")
                self.assertEqual(unknown.returncode, 2, unknown.stdout + unknown.stderr)
                self.assertIn("unknown key 'colour'", unknown.stdout + unknown.stderr)
                missing = run(program, "--config", os.path.join(work, "absent.yaml"))
                self.assertEqual(missing.returncode, 2)
                self.assertIn("absent.yaml: config file not found", missing.stdout + missing.stderr)
                key, value = BAD_VALUE[program]
                config = os.path.join(work, program + ".yaml")
                with open(config, "w") as f:
                    f.write(f"{key}: {value}\n")
                bad = run(program, "--config", config)
                self.assertEqual(bad.returncode, 2, bad.stdout + bad.stderr)
                self.assertIn(f"'{key}'", bad.stdout + bad.stderr)

    def test_generate_refuses_what_it_would_ignore(self):
        for args, stdin, message in [((), "", "set prompt"),
                                     (("--prompt", "x", "--top_k", "5"), "", "set temperature > 0"),
                                     (("--prompt", "-"), "", "read nothing from standard input"),
                                     (("--prompt", "x", "--system", "be brief"), "", "system goes with chat")]:
            with self.subTest(args=args):
                out = run("amaq-generate", *args, stdin=stdin)
                self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
                self.assertIn(message, out.stderr)

    def test_server_refuses_what_it_cannot_serve(self):
        model = os.path.join(ROOT, "models", "amaq-base")
        base = ("--model", model, "--listen", "127.0.0.1:0")
        work = tempfile.mkdtemp(prefix="amaq-programs-")
        absent = os.path.join(work, "absent.pem")
        for args, code, message in [((), 2, "the server needs tls_cert and tls_key"),
                                    (("--insecure", "true", "--metrics_listen", "127.0.0.1:0", "--metrics_tls", "true"), 2,
                                     "metrics_tls serves HTTPS with the server's certificate: set tls_cert and tls_key"),
                                    (("--tls_cert", absent, "--tls_key", absent), 1, "no file " + absent)]:
            with self.subTest(args=args):
                out = run("amaq-server", *base, *args)
                self.assertEqual(out.returncode, code, out.stdout + out.stderr)
                self.assertIn(message, out.stdout + out.stderr)

    def test_two_servers_form_a_replica_set_place_clients_and_refuse_one_of_another_run(self):
        def free_port():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
        work = tempfile.mkdtemp(prefix="amaq-replicas-")
        rendezvous = f"127.0.0.1:{free_port()}"

        def server_args(rank, *extra):
            address = f"127.0.0.1:{free_port()}"  # where clients reach it: what it listens on
            return [os.path.join(BIN, "amaq-server"), "--model", os.path.join(ROOT, "models", "amaq-base"), "--insecure", "true",
                    "--listen", address, "--port_file", os.path.join(work, f"port-{rank}"), "--shared_lora", "true",
                    "--replicas", "2", "--replica_rank", str(rank), "--rendezvous", rendezvous,
                    "--public_address", address, "--replica_timeout_seconds", "60",
                    "--replica_sync_seconds", "0.2", "--threads", "1", *extra]
        logs = [open(os.path.join(work, f"server-{rank}.log"), "w+") for rank in (0, 1)]
        for log in logs:
            self.addCleanup(log.close)
        metrics = f"127.0.0.1:{free_port()}"
        rank0 = subprocess.Popen(server_args(0, "--metrics_listen", metrics, "--metrics_public", "true"), stdout=logs[0],
                                 stderr=subprocess.STDOUT)
        try:
            other_run = subprocess.run(server_args(1, "--lr", "0.5"), capture_output=True, text=True, timeout=120)
            self.assertNotEqual(other_run.returncode, 0, other_run.stdout + other_run.stderr)
            self.assertIn("refused from the replica set", other_run.stdout + other_run.stderr)
            self.assertIn("lr: 0.5 here, 0.002 at rank 0", other_run.stdout + other_run.stderr)
            rank1 = subprocess.Popen(server_args(1), stdout=logs[1], stderr=subprocess.STDOUT)
            try:
                ports = []
                for rank in (0, 1):  # a replica serves once the set has formed
                    path, deadline = os.path.join(work, f"port-{rank}"), time.time() + 60
                    while not (os.path.exists(path) and open(path).read().endswith("\n")) and time.time() < deadline:
                        time.sleep(0.1)
                    ports.append(open(path).read().strip())
                # Four clients all given rank 0: those rank 1 owns are sent there and train there.
                sent = []
                for i in range(4):
                    client = subprocess.run(
                        [os.path.join(BIN, "amaq-client"), "--server", f"127.0.0.1:{ports[0]}", "--insecure", "true",
                         "--client_id", f"client-{i}", "--model", os.path.join(ROOT, "models", "amaq-base"),
                         "--data", os.path.join(ROOT, "data"), "--steps", "1", "--batch", "4", "--micro_batches", "1",
                         "--eval_examples", "4", "--threads", "1", "--progress", "false"],
                        capture_output=True, text=True, timeout=120)
                    self.assertEqual(client.returncode, 0, client.stdout + client.stderr)
                    if "serves client client-" in client.stdout + client.stderr:
                        self.assertRegex(client.stdout + client.stderr,
                                         f"127.0.0.1:[0-9]+ serves client client-{i} \\(answered by 127.0.0.1:{ports[0]}\\)")
                        sent.append(f"client-{i}")
                self.assertTrue(0 < len(sent) < 4, f"rank 1 owns some of the four and rank 0 the others: {sent}")
                time.sleep(1)  # a few synchronisations of the shared LoRA
                page = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
                self.assertIn("\namaq_replica_rank 0\n", page)
                self.assertIn("\namaq_replicas 2\n", page)
                self.assertRegex(page, "\namaq_replica_synchronisations_total [1-9]")
                for i in range(4):  # the steps /metrics counts are those of the clients served here
                    self.assertEqual(f'amaq_steps_total{{client="client-{i}"}} 1' in page, f"client-{i}" not in sent, page)
                for rank, process in ((1, rank1), (0, rank0)):
                    process.send_signal(signal.SIGTERM)
                    self.assertEqual(process.wait(timeout=60), 0)
            finally:
                rank1.kill()
        finally:
            rank0.kill()
        for rank in (0, 1):
            logs[rank].seek(0)
            log = logs[rank].read()
            self.assertIn(f"replica {rank} of 2: the replica set formed at generation", log)
            self.assertRegex(log, f"replica {rank} of 2: the shared LoRA averaged over the replicas [1-9]")
            for i in range(4):  # each client's session on its owner alone
                owner = 1 if f"client-{i}" in sent else 0
                self.assertEqual(f"client client-{i} joined" in log, rank == owner, f"rank {rank}, client-{i}: {log}")

    def test_generate_quiet_prints_the_continuation_alone(self):
        model = os.path.join(ROOT, "models", "amaq-base")
        out = run("amaq-generate", "--model", model, "--prompt", "the", "--max_new_tokens", "2", "--quiet", "true")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stderr, "", "quiet logs nothing but warnings and errors")
        self.assertTrue(out.stdout.endswith("\n") and out.stdout.count("\n") >= 1, out.stdout)

    def test_check_config_refuses_a_file_task_without_its_files(self):
        for args, message in [((), "no training file: set train_file"),
                              (("--train_file", "t.jsonl"), "no validation file: set validation_file")]:
            with self.subTest(args=args):
                out = run("amaq-client", "--task", "file", *args, "--check_config", "true")
                self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
                self.assertIn(message, out.stdout + out.stderr)
        given = run("amaq-client", "--task", "file", "--train_file", "t.jsonl", "--validation_file", "v.jsonl",
                    "--check_config", "true")
        self.assertEqual(given.returncode, 0, given.stdout + given.stderr)


if __name__ == "__main__":
    unittest.main()
