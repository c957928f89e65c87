#!/usr/bin/python3
"""soak: many clients coming and going for half an hour; the server's memory, descriptors, sessions and step latency over time.

    scripts/bench soak                      # 32 clients, 30 minutes, in runs/soak-<date>
    bench/soak.py [--minutes 30] [--clients 32] [--warmup 10] [--work DIR] [--bin build/bin] [--model DIR]

One amaq-server (TLS, per-client server LoRA, checkpoints every 200 steps, idle sessions moved to
disk after 60 s: session_ttl_seconds, AQ-SGD caches of 8 MiB a client spilling to disk) and
--clients amaq-client processes, each a client id with its own share of the data (shard_count):
a quarter train with AQ-SGD (aqsgd:4), a quarter on the verbs task evaluate every 25 steps by
greedy decoding with the server's KV cache, the rest train with the default AMAQ method. Each
client connects, trains 40-120 steps, saves its checkpoint and exits; after 0-90 s offline it
starts again and resumes (a rejoin every one to three minutes). Every 10 s the script samples the
server's resident memory (VmRSS), its open descriptors (/proc/PID/fd), the sessions it holds in
memory and has evicted (/metrics) and the p50 and p99 step latency of the steps that finished in
those 10 s (the clients' CSVs).

After --minutes no client starts again; when the last has finished, each joins once more asking
for no new steps (the server loads the evicted sessions), and the script checks that nothing was
lost: every connection exited 0, and the server applied exactly the steps each client asked for
and fits a line to memory and descriptors from --warmup minutes to --minutes (the clients'
finish left out): the slope and its 95% interval.
It writes DIR/samples.csv and DIR/soak.png (matplotlib), prints the summary, and exits 1 when a
step was lost or a client failed.
"""
import argparse
import csv
import datetime
import functools
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from local_cluster import ROOT, client_command, free_port, make_certs, metric, server_command, steps_applied  # noqa: E402
import local_cluster  # noqa: E402

wait_for = functools.partial(local_cluster.wait_for, program="soak")
SAMPLE_SECONDS = 10


class Client:
    """One client id: its role, the steps it has asked for, and its process while connected."""

    def __init__(self, index, count, rng):
        self.id = f"soak-{index:02d}"
        self.role = ["aqsgd", "decoding", "amaq", "amaq"][index % 4]
        self.shard, self.count, self.rng = index, count, rng
        self.steps = 0              # asked for so far (the running connection included)
        self.process = None
        self.connections = 0
        self.next_start = rng.uniform(0, 30)  # seconds after the start: clients arrive over half a minute
        self.csv_offsets = {}
        self.failures = []

    def start(self, args, port, certs, dir, more=True):
        """Connects again; `more` false: asks for no new steps (a Join, and the evaluation)."""
        self.connections += 1
        self.steps += self.rng.randint(40, 120) if more else 0
        role = {"aqsgd": ["--method", "aqsgd:4"],
                "decoding": ["--task", "verbs", "--eval_every", "25", "--eval_examples", "32"],
                "amaq": []}[self.role]
        self.csv = f"{dir}/{self.id}.{self.connections}.csv"
        self.process = subprocess.Popen(
            client_command(args.bin, args.model, port, certs, self.id, "--data", f"{ROOT}/data",
                           "--shard_count", str(self.count), "--shard_index", str(self.shard), "--seed", str(self.shard),
                           "--steps", str(self.steps), "--batch", "8", "--max_tokens", "32", "--eval_examples", "16",
                           "--csv", self.csv, "--checkpoint_dir", f"{dir}/{self.id}", "--checkpoint_every", "1000",
                           "--retry_seconds", "300", *role),
            stdout=open(f"{dir}/{self.id}.{self.connections}.log", "w"), stderr=subprocess.STDOUT)

    def poll(self, now):
        """Returns whether the connection ended now; schedules the next one."""
        if self.process is None or self.process.poll() is None:
            return False
        if self.process.returncode != 0:
            self.failures.append(f"{self.id}: connection {self.connections} exited with {self.process.returncode} "
                                 f"(see its .log)")
        self.process = None
        self.next_start = now + self.rng.uniform(0, 90)
        return True

    def new_latencies(self):
        """The wall seconds of the training steps written to this client's CSVs since the last call."""
        seconds = []
        for i in range(1, self.connections + 1):
            path = f"{os.path.dirname(self.csv)}/{self.id}.{i}.csv"
            if not os.path.exists(path):
                continue
            with open(path, "rb") as f:
                f.seek(self.csv_offsets.get(path, 0))
                while True:
                    line = f.readline().decode()
                    if not line.endswith("\n"):
                        break  # not written whole yet
                    self.csv_offsets[path] = f.tell()
                    fields = line.split(",")
                    if fields[0] != "client_id" and fields[11] == "":  # a step's row (not the header, not an evaluation's)
                        seconds.append(float(fields[12]))
        return seconds


def proc_status_mib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


def slope_per_hour(samples, key):
    """Least-squares slope of `key` against time, per hour, with its 95% interval (normal)."""
    points = [(s["seconds"], s[key]) for s in samples]
    if len(points) < 3:
        return float("nan"), float("nan")
    xs, ys = [p[0] / 3600 for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys)) / (len(points) - 2)
    return b, 1.96 * (residual / sxx) ** 0.5


def plot(samples, warmup_seconds, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    minutes = [s["seconds"] / 60 for s in samples]
    panels = [("server RSS (MiB)", ["rss_mib"]), ("open descriptors", ["fds"]),
              ("sessions", ["sessions_in_memory", "sessions_evicted", "clients_connected"]),
              ("step latency (ms)", ["p50_ms", "p99_ms"])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 10), sharex=True)
    for ax, (title, keys) in zip(axes, panels):
        for key in keys:
            ax.plot(minutes, [s[key] for s in samples], label=key)
        ax.axvline(warmup_seconds / 60, color="grey", linestyle=":", linewidth=1)
        ax.set_ylabel(title)
        ax.set_ylim(bottom=0)
        if len(keys) > 1:
            ax.legend(fontsize="small", loc="upper left")
    axes[-1].set_xlabel("minutes (dotted: end of warm-up)")
    fig.suptitle("amaq-server under a soak: clients joining and leaving")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=15, help="minutes left out of the slopes")
    parser.add_argument("--work", default=os.path.join(ROOT, "runs", f"soak-{datetime.date.today()}"))
    parser.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "amaq-base"))
    args = parser.parse_args()
    started = time.time()

    def log(message):
        print(f"soak [{(time.time() - started) / 60:5.1f} min] {message}", flush=True)

    certs = os.path.join(args.work, "certs")
    if os.path.isdir(args.work):  # a run starts afresh (the certificates stay)
        for name in os.listdir(args.work):
            if name != "certs":
                path = os.path.join(args.work, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(args.work, exist_ok=True)
    rng = random.Random(1)
    clients = [Client(i, args.clients, random.Random(rng.random())) for i in range(args.clients)]
    make_certs(certs, [c.id for c in clients])
    port, metrics_port = free_port(), free_port()
    server = subprocess.Popen(
        server_command(args.bin, args.model, port, metrics_port, certs, f"{args.work}/server",
                       "--checkpoint_every", "200", "--session_ttl_seconds", "60",
                       "--aqsgd_cache_mb", "8", "--aqsgd_spill_dir", f"{args.work}/aqsgd-spill"),
        stdout=open(f"{args.work}/server.log", "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: local_cluster.metrics(metrics_port) is not None, 120, "amaq-server did not answer on its metrics port")
    log(f"{args.clients} clients for {args.minutes:g} minutes in {args.work} (server pid {server.pid})")
    samples, latencies, next_sample, rejoins = [], [], SAMPLE_SECONDS, 0
    try:
        while True:
            now = time.time() - started
            ending = now >= args.minutes * 60
            for c in clients:
                rejoins += c.poll(now)
                if c.process is None and not ending and now >= c.next_start:
                    c.start(args, port, certs, args.work)
            if ending and all(c.process is None for c in clients):
                break
            if now >= next_sample:
                for c in clients:
                    latencies += c.new_latencies()
                text = local_cluster.metrics(metrics_port)
                samples.append({
                    "seconds": round(now, 1), "rss_mib": round(proc_status_mib(server.pid, "VmRSS"), 1),
                    "fds": len(os.listdir(f"/proc/{server.pid}/fd")),
                    "sessions_in_memory": int(metric(text, "amaq_sessions_in_memory")),
                    "sessions_evicted": int(metric(text, "amaq_sessions_evicted_total")),
                    "clients_connected": sum(c.process is not None for c in clients),
                    "steps": sum(steps_applied(text).values()), "steps_in_window": len(latencies),
                    "p50_ms": round(percentile(latencies, 0.5) * 1e3, 1), "p99_ms": round(percentile(latencies, 0.99) * 1e3, 1)})
                latencies = []
                next_sample += SAMPLE_SECONDS
                if len(samples) % 30 == 0:
                    log(", ".join(f"{k} {v}" for k, v in samples[-1].items() if k != "seconds"))
            if now > args.minutes * 60 + 900:
                raise SystemExit("soak: clients still running 15 minutes after the end (see their .log files)")
            time.sleep(0.2)
        # Evicted sessions are not on /metrics: each client joins once more, asking for no new steps,
        # so that the server loads its session and shows the steps it holds.
        for c in clients:
            c.start(args, port, certs, args.work, more=False)
        for c in clients:
            c.process.wait(timeout=600)
            c.poll(time.time() - started)
        applied = steps_applied(local_cluster.metrics(metrics_port))
    finally:
        for c in clients:
            if c.process is not None:
                c.process.kill()
        server.kill()
        server.wait()
    with open(f"{args.work}/samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(samples[0]))
        writer.writeheader()
        writer.writerows(samples)
    warmup = args.warmup * 60
    plot(samples, warmup, f"{args.work}/soak.png")
    failures = [f for c in clients for f in c.failures]
    failures += [f"{c.id}: the server applied {applied.get(c.id)} steps, the client asked for {c.steps}"
                 for c in clients if applied.get(c.id) != c.steps]
    after = [s for s in samples if warmup <= s["seconds"] <= args.minutes * 60]  # not the warm-up, not the last clients' finish
    busy = [s for s in after if s["steps_in_window"] > 0] or after
    for key, unit in [("rss_mib", "MiB"), ("fds", "descriptors")]:
        b, half = slope_per_hour(after, key)
        values = [s[key] for s in after]
        log(f"{key} after warm-up: {min(values)}..{max(values)}, mean {statistics.fmean(values):.1f}; "
            f"slope {b:+.2f} {unit}/hour (95% interval {b - half:+.2f}..{b + half:+.2f})")
    log(f"steps applied {sum(applied.values())} in {sum(c.connections for c in clients)} connections "
        f"({rejoins} ended and rejoined later); p50 of the windows' p50 {statistics.median(s['p50_ms'] for s in busy):.0f} ms, "
        f"largest p99 {max(s['p99_ms'] for s in busy):.0f} ms; sessions in memory at most "
        f"{max(s['sessions_in_memory'] for s in samples)}, evicted {samples[-1]['sessions_evicted']}")
    log(f"wrote {args.work}/samples.csv and {args.work}/soak.png")
    for f in failures:
        log("FAILED: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
