#!/usr/bin/python3
"""deploy_test.py BIN_DIR: deploy/ is consistent with the programs it runs.

- Kubernetes (deploy/k8s and its two-replica overlay deploy/k8s-replicas, rendered by `kubectl
  kustomize`): every amaq container's arguments pass the program's own --check_config (with its
  ConfigMap as the --config file, each Job index and StatefulSet pod substituted), every path they
  name lies on a volume that holds it (a Secret's or ConfigMap's key, a writable volume for what
  the program writes), and ports, probes, Services, the ServiceMonitor, NetworkPolicies and claims
  refer to what exists; the replicas' ranks, addresses and rendezvous name their own pods.
- Compose (deploy/compose.yaml): the same for each amaq command, and the link through amaq-netem.
- Prometheus (deploy/prometheus): promtool checks the configuration and the rules and runs the
  rules' unit tests; alerts and the Grafana dashboard use only metrics amaq-server exports.

A part whose tool is missing (kubectl, promtool) is reported as skipped, by name.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")
BIN = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin")
WRITTEN_KEYS = {"checkpoint_dir", "csv", "adapter_out", "aqsgd_spill_dir"}  # what the programs write


def check_config(program, args):
    """Runs `program --check_config true ARGS`; returns (exit code, output)."""
    p = subprocess.run([os.path.join(BIN, program), *args, "--check_config", "true"], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def flags(args):
    """--key value pairs of an argument list, as a dict."""
    out, i = {}, 0
    while i < len(args):
        assert args[i].startswith("--"), f"argument {args[i]!r} is not a --key"
        out[args[i][2:]] = args[i + 1]
        i += 2
    return out


def settings(config_text, args):
    """The effective string settings: the config file's, then the flags'."""
    s = {k: str(v) for k, v in (yaml.safe_load(config_text) or {}).items()}
    s.update(flags(args))
    return s


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def exported_metrics():
    """Metric names amaq-server renders (server/prometheus_text.cc, PrometheusText)."""
    with open(os.path.join(ROOT, "server", "prometheus_text.cc")) as fh:
        return set(re.findall(r'metric\("(amaq_[a-z_]+)"', fh.read()))


def metric_names(expr):
    return set(re.findall(r"\bamaq_[a-z_]+", expr))


class Kubernetes(unittest.TestCase):
    KUSTOMIZATION = "k8s"

    @classmethod
    def setUpClass(cls):
        if not shutil.which("kubectl"):
            raise unittest.SkipTest("kubectl not installed: the Kubernetes manifests were not checked")
        text = subprocess.run(["kubectl", "kustomize", os.path.join(DEPLOY, cls.KUSTOMIZATION)], check=True,
                              capture_output=True, text=True).stdout
        cls.objects = [o for o in yaml.safe_load_all(text) if o]
        cls.by_kind = {}
        for o in cls.objects:
            cls.by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o

    def workloads(self):
        """(workload, pod spec, container, indices) for every amaq container: a Job's completion
        indices, a StatefulSet's pod ordinals."""
        for kind in ("Deployment", "StatefulSet", "Job"):
            for w in self.by_kind.get(kind, {}).values():
                spec = dict(w["spec"]["template"]["spec"])
                # A StatefulSet's claim templates are volumes of its pods, one claim per pod.
                spec["volumes"] = spec.get("volumes", []) + [
                    {"name": t["metadata"]["name"], "persistentVolumeClaim": {"claimName": t["metadata"]["name"]}}
                    for t in w["spec"].get("volumeClaimTemplates", [])]
                indices = {"Job": range(w["spec"].get("completions", 1)),
                           "StatefulSet": range(w["spec"].get("replicas", 1))}.get(kind, [None])
                for c in spec["containers"]:
                    if c["image"].split(":")[0].startswith("amaq-"):
                        yield w, spec, c, indices

    def expand(self, workload, container, args, index):
        """$(VAR) in args from the container's env: the index for a Job's completion-index
        annotation or a StatefulSet's pod-index label, the pod's name for metadata.name."""
        values = {}
        for e in container.get("env", []):
            ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
            if "job-completion-index" in ref or "pod-index" in ref:
                values[e["name"]] = str(index)
            elif ref == "metadata.name":
                values[e["name"]] = f"{workload['metadata']['name']}-{index}"
            else:
                values[e["name"]] = e.get("value", "")
        return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in args]

    def claims(self):
        """The claims a pod may mount: the PersistentVolumeClaims and the StatefulSets' templates."""
        return set(self.by_kind.get("PersistentVolumeClaim", {})) | {
            t["metadata"]["name"] for w in self.by_kind.get("StatefulSet", {}).values()
            for t in w["spec"].get("volumeClaimTemplates", [])}

    def mount_for(self, spec, container, path, index):
        """The (volume, mount) holding `path`, the longest mount path first."""
        mounts = sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
        for m in mounts:
            if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
                volume = next(v for v in spec["volumes"] if v["name"] == m["name"])
                return volume, m
        self.fail(f"{container['name']}: {path} lies on no volume (index {index})")

    def config_text(self, spec, container, path):
        volume, mount = self.mount_for(spec, container, path, None)
        name = volume["configMap"]["name"]
        cm = self.by_kind["ConfigMap"].get(name)
        self.assertIsNotNone(cm, f"ConfigMap {name} is not in the rendered manifests")
        return cm["data"][os.path.relpath(path, mount["mountPath"])]

    def test_every_container_passes_check_config_and_a_broken_one_does_not(self):
        checked = 0
        for w, spec, c, indices in self.workloads():
            program = c["image"].split(":")[0]
            for index in indices:
                args = self.expand(w, c, c["args"], index)
                with tempfile.NamedTemporaryFile("w", suffix=".yaml") as cfg:
                    cfg.write(self.config_text(spec, c, flags(args)["config"]))
                    cfg.flush()
                    local = [cfg.name if a == flags(args)["config"] else a for a in args]
                    rc, out = check_config(program, local)
                    self.assertEqual(rc, 0, f"{w['metadata']['name']} index {index}: {out}")
                    rc, out = check_config(program, local + ["--cut_layer", "-1"])
                    self.assertEqual(rc, 2, f"a bad value passed the check: {out}")
                checked += 1
        self.assertGreaterEqual(checked, 3, "the server and two client indices")

    def test_paths_lie_on_volumes_that_hold_them(self):
        for w, spec, c, indices in self.workloads():
            for index in indices:
                args = self.expand(w, c, c["args"], index)
                s = settings(self.config_text(spec, c, flags(args)["config"]), args)
                for key, value in s.items():
                    if not value.startswith("/") or key == "config":
                        continue
                    volume, mount = self.mount_for(spec, c, value, index)
                    where = f"{w['metadata']['name']} index {index}: {key}={value}"
                    if key in WRITTEN_KEYS:
                        self.assertFalse(mount.get("readOnly", False), f"{where}: written to a read-only mount")
                    if "secret" in volume:
                        items = [i["path"] for i in volume["secret"].get("items", [])]
                        self.assertIn(os.path.relpath(value, mount["mountPath"]), items, f"{where}: not a key of the Secret")
                    if "persistentVolumeClaim" in volume:
                        claim = volume["persistentVolumeClaim"]["claimName"]
                        self.assertIn(claim, self.claims(), f"{where}: no claim {claim}")

    def test_ports_probes_services_and_policies_line_up(self):
        server = self.by_kind["StatefulSet"]["amaq-server"]
        pod = server["spec"]["template"]
        c = pod["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        s = settings(self.config_text(pod["spec"], c, flags(c["args"])["config"]), c["args"])
        self.assertEqual(ports["grpc"], port_of(s["listen"]))
        self.assertEqual(ports["metrics"], port_of(s["metrics_listen"]))
        self.assertTrue(s["metrics_listen"].startswith("0.0.0.0:"), "probes and Prometheus reach the metrics port")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            self.assertIn(c[probe]["httpGet"]["port"], ports, probe)
        self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/readyz")
        self.assertIn("nvidia.com/gpu", c["resources"]["limits"])
        self.assertGreaterEqual(pod["spec"]["terminationGracePeriodSeconds"], 30, "the drain and the checkpoint")
        headless = self.by_kind["Service"][server["spec"]["serviceName"]]
        self.assertEqual(headless["spec"]["clusterIP"], "None", "each server pod has its own name")
        self.assertTrue(headless["spec"]["publishNotReadyAddresses"], "replicas meet before they are ready")
        self.assertEqual(server["spec"]["podManagementPolicy"], "Parallel", "replicas start together")
        labels = pod["metadata"]["labels"]
        for svc in self.by_kind["Service"].values():
            self.assertLessEqual(svc["spec"]["selector"].items(), labels.items(), svc["metadata"]["name"])
            for p in svc["spec"]["ports"]:
                self.assertIn(p["targetPort"], ports, svc["metadata"]["name"])
        monitor = next(iter(self.by_kind["ServiceMonitor"].values()))
        monitored = [svc for svc in self.by_kind["Service"].values()
                     if monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"].get("labels", {}).items()]
        self.assertEqual(len(monitored), 1, "the ServiceMonitor selects the metrics Service")
        self.assertIn(monitor["spec"]["endpoints"][0]["port"], [p["name"] for p in monitored[0]["spec"]["ports"]])
        token = monitor["spec"]["endpoints"][0]["bearerTokenSecret"]
        tokens_volume = next(v for v in pod["spec"]["volumes"] if v.get("secret", {}).get("secretName") == token["name"])
        self.assertIn(token["key"], [i["key"] for i in tokens_volume["secret"]["items"]])
        for policy in self.by_kind["NetworkPolicy"].values():
            for rule in policy["spec"].get("ingress", []) + policy["spec"].get("egress", []):
                for p in rule.get("ports", []):
                    self.assertTrue(isinstance(p["port"], int) or p["port"] in ports, f"{policy['metadata']['name']}: {p}")
        job = self.by_kind["Job"]["amaq-clients"]
        jc = job["spec"]["template"]["spec"]["containers"][0]
        js = settings(self.config_text(job["spec"]["template"]["spec"], jc, flags(jc["args"])["config"]), [])
        host, port = js["server"].rsplit(":", 1)
        service = self.by_kind["Service"][host]
        self.assertIn(int(port), [p["port"] for p in service["spec"]["ports"]], "the clients' server address")
        self.assertEqual(int(js["shard_count"]), job["spec"]["completions"], "one shard per Job index")


class KubernetesReplicas(Kubernetes):
    """deploy/k8s-replicas: the same checks, and the replica set's own settings."""
    KUSTOMIZATION = "k8s-replicas"

    def test_each_pod_is_its_rank_at_its_own_name_and_rank_0_keeps_the_rendezvous(self):
        server = self.by_kind["StatefulSet"]["amaq-server"]
        pod = server["spec"]["template"]
        c = pod["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        headless = server["spec"]["serviceName"]
        replicas = server["spec"]["replicas"]
        self.assertGreater(replicas, 1)
        config = self.config_text(pod["spec"], c, flags(c["args"])["config"])
        for index in range(replicas):
            s = settings(config, self.expand(server, c, c["args"], index))
            self.assertEqual(int(s["replicas"]), replicas)
            self.assertEqual(int(s["replica_rank"]), index)
            self.assertEqual(s["public_address"], f"amaq-server-{index}.{headless}:{port_of(s['listen'])}")
            host, port = s["rendezvous"].rsplit(":", 1)
            self.assertEqual(host, f"amaq-server-0.{headless}", "rank 0 keeps the rendezvous")
            self.assertIn(int(port), ports.values(), "the rendezvous port is declared")
        policy = self.by_kind["NetworkPolicy"]["amaq-server"]["spec"]
        between = {"podSelector": {"matchLabels": pod["metadata"]["labels"]}}
        self.assertIn({"from": [between]}, policy["ingress"], "Gloo's ports: every port between server pods")
        self.assertIn({"to": [between]}, policy["egress"])


class Compose(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(DEPLOY, "compose.yaml")) as fh:
            cls.services = yaml.safe_load(fh)["services"]

    def host_path(self, service, path):
        """The file in deploy/ a container path maps to through the service's volumes, or None."""
        for v in service.get("volumes", []):
            source, target = v.split(":")[:2]
            if path.startswith(target + "/") and source.startswith("."):
                return os.path.normpath(os.path.join(DEPLOY, source, os.path.relpath(path, target)))
        return None

    def test_every_amaq_command_passes_check_config(self):
        checked = 0
        for name, service in self.services.items():
            program, args = service["command"][0], service["command"][1:]
            if not program.startswith("amaq-"):
                continue
            local = [self.host_path(service, a) if a.endswith(".yaml") else a for a in args]
            rc, out = check_config(program, local)
            self.assertEqual(rc, 0, f"{name}: {out}")
            checked += 1
        self.assertEqual(checked, 4, "server, netem and two clients")

    def test_the_clients_reach_the_server_through_netem_and_prometheus_scrapes_it(self):
        server = flags(self.services["server"]["command"][1:])
        netem = flags(self.services["netem"]["command"][1:])
        self.assertEqual(netem["upstream"], server["listen"])
        for name in ("client-1", "client-2"):
            self.assertEqual(flags(self.services[name]["command"][1:])["server"], netem["listen"], name)
        with open(self.host_path(self.services["server"], server["config"])) as fh:
            metrics = yaml.safe_load(fh)["metrics_listen"]
        with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")) as fh:
            scrape = yaml.safe_load(fh)["scrape_configs"][0]
        self.assertEqual(scrape["static_configs"][0]["targets"], [metrics])
        self.assertEqual(scrape["authorization"]["credentials_file"], server["metrics_token_file"])
        shards = sorted(flags(self.services[n]["command"][1:])["shard_index"] for n in ("client-1", "client-2"))
        self.assertEqual(shards, ["0", "1"])


class Monitoring(unittest.TestCase):
    def test_alerts_and_dashboard_use_exported_metrics(self):
        exported = exported_metrics()
        self.assertIn("amaq_steps_total", exported)
        with open(os.path.join(DEPLOY, "prometheus", "alerts.yml")) as fh:
            rules = [r for g in yaml.safe_load(fh)["groups"] for r in g["rules"]]
        self.assertEqual({r["alert"] for r in rules},
                         {"AmaqServerDown", "AmaqNoAppliedSteps", "AmaqStalledStream", "AmaqCheckpointFailures"})
        with open(os.path.join(DEPLOY, "grafana", "amaq-dashboard.json")) as fh:
            panels = json.load(fh)["panels"]
        exprs = [r["expr"] for r in rules] + [t["expr"] for p in panels for t in p["targets"]]
        for expr in exprs:
            self.assertLessEqual(metric_names(expr), exported, expr)
        used = set().union(*(metric_names(e) for e in exprs))
        self.assertEqual(used, exported, "every exported metric is on the dashboard or in an alert")

    def test_promtool_checks_the_configuration_and_runs_the_alert_tests(self):
        if not shutil.which("promtool"):
            self.skipTest("promtool not installed (Debian's prometheus): the Prometheus files were not checked")
        d = os.path.join(DEPLOY, "prometheus")
        for args in (["check", "config", "--syntax-only", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                     ["test", "rules", "alerts_test.yml"]):
            p = subprocess.run(["promtool", *args], cwd=d, capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, f"promtool {' '.join(args)}: {p.stdout}{p.stderr}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
