"""Helpers for scripts that run amaq-server and amaq-clients as processes on this machine, over TLS
on loopback with scripts/make-certs's files (scripts/chaos, bench/soak.py).

The commands are lists for subprocess; `extra` appends settings (a later --key wins over an earlier
one). Metrics are read from the server's metrics port over plain HTTP (metrics_public true).
"""
import os
import re
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, seconds, what, program="local_cluster"):
    """Polls `condition` until it holds; stops the program naming `what` after `seconds`."""
    end = time.time() + seconds
    while time.time() < end:
        if condition():
            return
        time.sleep(0.05)
    raise SystemExit(f"{program}: {what} within {seconds} s")


def make_certs(dir, clients):
    """Certificates and tokens for the server and `clients` in `dir`, unless they are there."""
    if not os.path.exists(os.path.join(dir, "tokens")):
        subprocess.run([os.path.join(ROOT, "scripts", "make-certs"), dir, *clients], check=True, stdout=subprocess.DEVNULL)


def server_command(bin, model, port, metrics_port, certs, checkpoint_dir, *extra):
    return [f"{bin}/amaq-server", "--model", model, "--listen", f"127.0.0.1:{port}",
            "--tls_cert", f"{certs}/server.pem", "--tls_key", f"{certs}/server.key", "--tokens_file", f"{certs}/tokens",
            "--checkpoint_dir", checkpoint_dir, "--threads", "1",
            "--metrics_listen", f"127.0.0.1:{metrics_port}", "--metrics_public", "true", *extra]


def client_command(bin, model, port, certs, id, *extra):
    return [f"{bin}/amaq-client", "--server", f"127.0.0.1:{port}", "--tls_ca", f"{certs}/ca.pem",
            "--tls_server_name", "localhost", "--token_file", f"{certs}/{id}.token", "--client_id", id,
            "--model", model, "--threads", "1", "--progress=false", *extra]


def metrics(metrics_port):
    """The server's /metrics text, or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def metric(text, name):
    """The value of an unlabelled metric (0 when absent)."""
    m = re.search(rf"^{name} (\S+)$", text or "", re.M)
    return float(m.group(1)) if m else 0.0


def steps_applied(text):
    """Each client's applied training steps (amaq_steps_total)."""
    return {m.group(1): int(float(m.group(2))) for m in re.finditer(r'amaq_steps_total\{client="([^"]+)"\} (\S+)', text or "")}
