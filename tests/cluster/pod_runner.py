"""A loopback kubelet for the test control plane: pods scheduled onto loopback nodes
(ControlPlane.add_loopback_node) run for real, as local processes; kwok keeps simulating
the pods of every other node.

    cp.add_loopback_node("loop-0", pod_cidr_octet=10)     # pod IPs 198.18.10.0/24
    with PodRunner(cp.kubeconfig, ["loop-0"], image_map={"python:3.11": sys.prefix},
                   workdir=tmp_path) as runner:
        ...  # create pods with nodeSelector longctx.dev/loopback=true (and its toleration)
        print(runner.logs("ns", "pod"))

What it substitutes for a real node is listed in docs/test-harness.md. A pod's
processes and probes are in tests/cluster/pod_process.py, its volumes in pod_volumes.py, its
environment in pod_env.py; the
pod lifecycle (container restarts, status, deletion) in tests/cluster/pod_worker.py; the
pod network (a namespace and veth per pod on the harness's bridge) in
tests/cluster/pod_network.py.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.pod_network import POD_NETWORK, ApiRelay, PodNetwork, node_pod_cidr
from tests.cluster.pod_process import SYSTEM_PATH, PodSetupError
from tests.cluster.pod_status import HOST_IP, now
from tests.cluster.pod_worker import PodWorker, delete_pod, pod_hostname


def log(message: str) -> None:
    print(f"[pod-runner] {message}", file=sys.stderr, flush=True)


class Kube:
    """The few API calls the loopback kubelet makes, over HTTPS with the kubeconfig's token
    (no client-library dependency: its generated API changes between major versions)."""

    def __init__(self, kubeconfig: Path | str):
        import yaml
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"].rstrip("/")
        self.host = urllib.parse.urlsplit(self.server).hostname or "127.0.0.1"
        self.port = urllib.parse.urlsplit(self.server).port or 443
        self.ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        self.ssl = ssl.create_default_context(cadata=self.ca_pem)
        self.token = user["token"]

    def _open(self, method: str, path: str, body: Any = None, timeout: float = 30,
              content_type: str = "application/json"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type,
            "Accept": "application/json"})
        return urllib.request.urlopen(req, context=self.ssl, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> dict:
        with self._open(method, path, body, **kw) as resp:
            return json.loads(resp.read() or b"{}")

    def get(self, path: str) -> dict | None:
        """The object, or None when the API says 404."""
        try:
            return self.call("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def merge_patch(self, path: str, body: dict) -> dict:
        return self.call("PATCH", path, body, content_type="application/merge-patch+json")

    def watch(self, path: str, resource_version: str, timeout: int = 60):
        """Yields watch events until the server ends the watch."""
        sep = "&" if "?" in path else "?"
        with self._open("GET", f"{path}{sep}watch=1&resourceVersion={resource_version}"
                        f"&timeoutSeconds={timeout}&allowWatchBookmarks=true",
                        timeout=timeout + 15) as resp:
            for line in resp:
                yield json.loads(line)


@dataclass
class Image:
    """What an image name stands for: an environment directory whose bin/ leads PATH, plus
    the image's ENV, ENTRYPOINT and WORKDIR."""
    prefix: Path
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    working_dir: str = "/"


class PodRunner:
    """Watches the pods bound to `nodes` and runs them; keeps those nodes' heartbeats.

    kubeconfig: the control plane's admin kubeconfig. image_map: image -> env dir (or an
    Image). volume_map: PersistentVolumeClaim name -> host directory. backoff: the
    CrashLoopBackOff base and cap in seconds. max_grace: the cap on termination grace
    periods. Every process it starts is stopped by stop()."""

    def __init__(self, kubeconfig: Path | str, nodes: list[str],
                 image_map: dict[str, Path | str | Image],
                 volume_map: dict[str, Path | str] | None = None, workdir: Path | None = None,
                 backoff: tuple[float, float] = (10.0, 40.0), max_grace: float = 30.0,
                 heartbeat_seconds: float = 10.0):
        self.kube = Kube(kubeconfig)
        self.nodes = list(nodes)
        self.images = {k: v if isinstance(v, Image) else Image(Path(v))
                       for k, v in image_map.items()}
        self.volume_map = {k: Path(v) for k, v in (volume_map or {}).items()}
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="longctx-pods-"))
        self.backoff, self.max_grace, self.heartbeat_seconds = backoff, max_grace, heartbeat_seconds
        self.workers: dict[str, PodWorker] = {}
        self._finished: set[str] = set()
        self._ips: dict[str, str] = {}         # uid -> pod IP
        self.network = PodNetwork()
        self.api_relay: ApiRelay | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._since = now()

    # -- public

    def start(self) -> "PodRunner":
        self.node_objects = {}
        for name in self.nodes:
            node = self.kube.get(f"/api/v1/nodes/{name}")
            if node is None:
                raise RuntimeError(f"node {name} does not exist: add it with "
                                   "ControlPlane.add_loopback_node first")
            self.node_objects[name] = node
        self.network.open()
        self.api_relay = ApiRelay.acquire(self.kube.port, self.kube.host)
        self._heartbeat()   # at once: the node may have waited unattended since it was added
        for target in (self._watch_loop, self._heartbeat_loop):
            t = threading.Thread(target=target, daemon=True, name=f"pod-runner-{target.__name__}")
            t.start()
            self._threads.append(t)
        log(f"running pods of nodes {', '.join(self.nodes)}; logs under {self.workdir}")
        return self

    def stop(self, grace: float = 3.0) -> None:
        """Stops every process it started (SIGTERM, SIGKILL after `grace`) and removes their
        network namespaces, then the API relay and, when no other session uses it, the
        bridge; the pods stay in the API, as they would when a kubelet stops."""
        self._stop.set()
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            w.shutdown(grace, api=False)
        for w in workers:
            w.thread.join(timeout=grace + 60)
        for t in self._threads:
            t.join(timeout=2)
        if self.api_relay:
            self.api_relay.release()
            self.api_relay = None
        self.network.close()

    def __enter__(self) -> "PodRunner":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_dir(self, namespace: str, pod: str) -> Path | None:
        """The directory of a pod's container logs (<container>.log), newest pod first."""
        dirs = sorted(self.workdir.glob(f"pods/{namespace}_{pod}_*/logs"),
                      key=lambda p: p.stat().st_mtime)
        return dirs[-1] if dirs else None

    def log_path(self, namespace: str, pod: str, container: str) -> Path | None:
        d = self.log_dir(namespace, pod)
        return d / f"{container}.log" if d else None

    def logs(self, namespace: str, pod: str, lines: int = 40) -> str:
        """The tail of each container's log, for a failing test's message."""
        d = self.log_dir(namespace, pod)
        if d is None:
            return f"(no logs for pod {namespace}/{pod} under {self.workdir})"
        out = []
        for path in sorted(d.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(out)

    # -- used by the workers

    def image(self, name: str) -> Image:
        if name not in self.images:
            raise PodSetupError("ErrImagePull", f'image "{name}" is not in the PodRunner '
                                f"image_map (mapped: {sorted(self.images)})")
        return self.images[name]

    def base_env(self, pod: dict, image: Image) -> dict[str, str]:
        """What every container sees before its own env: PATH and HOME as an image sets
        them, the pod's hostname, the API server's address as the in-cluster client reads
        it (the node's address on the bridge, where the API relay listens)."""
        port = str(self.kube.port)
        return {"PATH": f"{image.prefix}/bin:{SYSTEM_PATH}", "HOME": "/root",
                "HOSTNAME": pod_hostname(pod), **image.env,
                "KUBERNETES_SERVICE_HOST": HOST_IP, "KUBERNETES_SERVICE_PORT": port,
                "KUBERNETES_SERVICE_PORT_HTTPS": port,
                "KUBERNETES_PORT": f"tcp://{HOST_IP}:{port}",
                "KUBERNETES_PORT_443_TCP": f"tcp://{HOST_IP}:{port}",
                "KUBERNETES_PORT_443_TCP_ADDR": HOST_IP,
                "KUBERNETES_PORT_443_TCP_PORT": port, "KUBERNETES_PORT_443_TCP_PROTO": "tcp"}

    def allocate_ip(self, pod: dict) -> str:
        """A pod IP from the node's podCIDR, unique among the pods of every session on this
        machine (PodNetwork.reserve); refuses any address outside the harness's pod network,
        the only one its bridge serves."""
        node = self.node_objects[pod["spec"]["nodeName"]]
        cidr = node["spec"].get("podCIDR", "")
        try:
            net = ipaddress.ip_network(cidr)
        except ValueError:
            raise PodSetupError("PodIPRefused", f"node {node['metadata']['name']} has no "
                                f"valid podCIDR ({cidr!r})") from None
        uid = pod["metadata"]["uid"]
        with self._lock:
            used = set(self._ips.values())
            previous = pod.get("status", {}).get("podIP")   # a pod a former runner started
            candidates = ([ipaddress.ip_address(previous)] if previous else []) + [
                h for h in net.hosts() if int(h) & 0xFF not in (0, 1, 255)]
            for ip in candidates:
                if str(ip) not in used and ip in net:
                    if ip not in POD_NETWORK:
                        raise PodSetupError("PodIPRefused", f"pod IP {ip} (podCIDR {cidr} of "
                                            f"node {node['metadata']['name']}) is outside "
                                            f"{POD_NETWORK}: the loopback kubelet refuses it")
                    if self.network.reserve(str(ip)):
                        self._ips[uid] = str(ip)
                        return str(ip)
        raise PodSetupError("PodIPRefused", f"podCIDR {cidr} is exhausted")

    def release(self, uid: str, reuse_ip: bool = True) -> None:
        """The pod is done; its IP is free again unless its network may still be in use."""
        with self._lock:
            ip = self._ips.pop(uid, None)
            self.workers.pop(uid, None)
            self._finished.add(uid)
        if ip and reuse_ip:
            self.network.unreserve(ip)

    # -- the watch

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.kube.call("GET", "/api/v1/pods")
                present = set()
                for pod in listed["items"]:
                    if pod["spec"].get("nodeName") in self.nodes:
                        present.add(pod["metadata"]["uid"])
                        self._dispatch("ADDED", pod)
                with self._lock:
                    gone = [w for uid, w in self.workers.items() if uid not in present]
                for w in gone:   # deleted while the watch was down
                    w.shutdown(2.0, api=False)
                for event in self.kube.watch("/api/v1/pods",
                                             listed["metadata"]["resourceVersion"], 30):
                    if self._stop.is_set() or event["type"] == "ERROR":
                        break   # ERROR: usually 410 Gone, a relist resumes
                    pod = event["object"]
                    if event["type"] != "BOOKMARK" and pod["spec"].get("nodeName") in self.nodes:
                        self._dispatch(event["type"], pod)
            except Exception as exc:  # the API server restarts in some tests: relist
                if not self._stop.is_set():
                    log(f"watch: {exc!r}; relisting")
                    self._stop.wait(1)

    def _dispatch(self, kind: str, pod: dict) -> None:
        uid, meta = pod["metadata"]["uid"], pod["metadata"]
        with self._lock:
            if self._stop.is_set() or uid in self._finished:
                return
            worker = self.workers.get(uid)
            if worker is None and kind != "DELETED":
                if meta.get("deletionTimestamp"):   # nothing of it runs: finalize it
                    worker = None
                elif pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    return   # finished under an earlier runner: a kubelet does not rerun it
                else:
                    worker = self.workers[uid] = PodWorker(self, pod)
                    worker.thread.start()
                    return
        if kind == "DELETED":
            if worker:
                worker.shutdown(2.0, api=False)
        elif worker:
            worker.update(pod)
        else:
            delete_pod(self.kube, pod)

    # -- node heartbeats

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self._heartbeat()
            except Exception as exc:
                log(f"heartbeat: {exc!r}")

    def _heartbeat(self) -> None:
        """What the kubelet renews so that the node lifecycle controller keeps the node
        Ready and untainted: the Ready condition's heartbeat and the node's Lease."""
        t = now()
        micro = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        for name in self.nodes:
            self.kube.merge_patch(f"/api/v1/nodes/{name}/status",
                                  {"status": {"conditions": node_conditions(t, self._since)}})
            path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
            if self.kube.get(f"{path}/{name}") is None:
                self.kube.call("POST", path, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                             "renewTime": micro}})
            else:
                self.kube.merge_patch(f"{path}/{name}", {"spec": {"renewTime": micro}})


def loopback_node(name: str, pod_cidr_octet: int, labels: dict[str, str] | None = None,
                  capacity: dict[str, str] | None = None, taints: list[dict] | None = None
                  ) -> tuple[dict, dict]:
    """A loopback node and the status patch that makes it Ready (ControlPlane
    .add_loopback_node creates them). No kwok annotation, so kwok ignores it; pod IPs from
    198.18.<octet>.0/24 (node_pod_cidr), its address the bridge's. Tainted
    longctx.dev/loopback=true:NoSchedule unless `taints` says otherwise, so that only pods
    that tolerate it land there, never the simulated workloads of other tests."""
    cidr = node_pod_cidr(pod_cidr_octet)
    resources = capacity or {"cpu": "2", "memory": "8Gi", "pods": "110"}
    if taints is None:
        taints = [{"key": "longctx.dev/loopback", "value": "true", "effect": "NoSchedule"}]
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "longctx.dev/loopback": "true", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": taints}}
    t = now()
    status = {"status": {
        "capacity": resources, "allocatable": resources, "conditions": node_conditions(t, t),
        "addresses": [{"type": "InternalIP", "address": HOST_IP},
                      {"type": "Hostname", "address": name}],
        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                     "kubeletVersion": "loopback"}}}
    return node, status


def node_conditions(heartbeat: str, since: str) -> list[dict]:
    """The conditions a healthy kubelet reports."""
    ok = {"MemoryPressure": "KubeletHasSufficientMemory",
          "DiskPressure": "KubeletHasNoDiskPressure",
          "PIDPressure": "KubeletHasSufficientPID"}
    conds = [{"type": t, "status": "False", "reason": r, "message": "loopback kubelet",
              "lastHeartbeatTime": heartbeat, "lastTransitionTime": since}
             for t, r in ok.items()]
    return conds + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "message": "loopback kubelet is posting ready status",
                     "lastHeartbeatTime": heartbeat, "lastTransitionTime": since}]

