"""A real local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with simulated H200 nodes. Every process binds 127.0.0.1.

Used by the pytest session fixture (tests/conftest.py) and by `make demo`
(`python -m tests.cluster.demo`). Binaries come from tools/build-control-plane.sh.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.kwok_stages import write_stages
from tests.cluster.manifests import h200_node
from tests.cluster.pki import write_kubeconfig, write_pki
from tests.cluster.pod_runner import loopback_node
from tests.cluster.processes import die_with_parent, free_port, terminate

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "build-control-plane.sh"
# helm is checked where it is used: the demo's build (--without-helm) leaves it out.
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
            "kubectl")
# Upstream kwok stages; pods become Ready through the project's own (kwok_stages.py).
KWOK_STAGES = ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-complete.yaml",
               "pod-delete.yaml")


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message says why."""


def log(message: str) -> None:
    print(f"[control-plane] {message}", file=sys.stderr, flush=True)


def ensure_binaries() -> Path:
    """Builds what is missing (or reuses the cache) and returns the bin directory."""
    override = os.environ.get("LONGCTX_BIN_DIR")
    if override:
        bin_dir = Path(override)
    else:
        if shutil.which("go") is None:
            raise ControlPlaneError("Go is not installed: the control plane is built from Go "
                                    "modules. Install Go >= 1.26 (https://go.dev/dl) and retry.")
        log("checking control-plane binaries (a cold build takes tens of minutes on 2 cores)")
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}; "
                                    "its output above says which build broke")
        bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    missing = [b for b in BINARIES if not (bin_dir / b).is_file()]
    if missing:
        raise ControlPlaneError(f"missing binaries in {bin_dir}: {', '.join(missing)}; run "
                                f"{BUILD_SCRIPT} to build them")
    return bin_dir


def share_dir_for(bin_dir: Path) -> Path:
    """Files fetched from Go modules beside the binaries: kwok stages and test CRDs."""
    candidates = sorted(bin_dir.parent.glob("share-k8s*"))
    if not candidates:
        raise ControlPlaneError(f"no share-k8s* directory beside {bin_dir}; run {BUILD_SCRIPT}")
    return candidates[-1]


# ------------------------------------------------------------------ the control plane


@dataclass
class ControlPlane:
    """Starts and stops the processes; only those it started are ever signalled."""

    nodes: int = 4
    # How long a pod of kwok_stages.LOAD_IMAGE takes to become Ready (a model load).
    load_seconds: float = 6.0
    workdir: Path | None = None
    bin_dir: Path | None = None
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    admin_token: str = field(default_factory=lambda: base64.b32encode(os.urandom(20)).decode())

    kubeconfig: Path = field(init=False)
    server: str = field(init=False)
    share_dir: Path = field(init=False)

    def start(self) -> "ControlPlane":
        started = time.monotonic()
        self.bin_dir = self.bin_dir or ensure_binaries()
        self.share_dir = share_dir_for(self.bin_dir)
        self._own_workdir = self.workdir is None
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix="longctx-cp-"))
        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        write_pki(pki)
        (self.workdir / "tokens.csv").write_text(
            f'{self.admin_token},admin,admin-uid,"system:masters"\n')
        try:
            self._start_etcd()
            self._start_apiserver(pki)
            self._start_controllers(pki)
            self._register_nodes()
        except BaseException:
            self.stop()
            raise
        log(f"control plane up in {time.monotonic() - started:.1f} s: {self.server} "
            f"({self.nodes} simulated H200 nodes); export KUBECONFIG={self.kubeconfig}")
        return self

    # -- processes

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        binary = self.bin_dir / name if name in BINARIES else Path(name)
        logf = open(self.workdir / f"{name}.log", "ab")   # a restarted process appends
        proc = subprocess.Popen([str(binary), *args], stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_parent)
        self.processes[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _wait(self, name: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.processes[name]
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with code {proc.returncode}:\n"
                                        f"{self.log_tail(name)}")
            try:
                if check():
                    return
            except Exception:  # not up yet
                pass
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not ready after {timeout:.0f} s:\n{self.log_tail(name)}")

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            f"--data-dir={self.workdir / 'etcd'}", f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true", "--log-level=warn"])
        self._wait("etcd", lambda: urllib.request.urlopen(f"{self.etcd_url}/health", timeout=1)
                   .status == 200, 30)

    def _start_apiserver(self, pki: Path) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self._apiserver_args = [
            f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}", "--authorization-mode=RBAC",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/16", "--allow-privileged=true",
            # The "kubernetes" Service would point at 127.0.0.1, which the reconciler refuses.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}", "--v=1",
            # A stopped server waits this long for open watches, not its default 20 s.
            "--shutdown-watch-termination-grace-period=2s"]
        self._spawn("kube-apiserver", self._apiserver_args)
        self._wait_apiserver(pki)
        self.kubeconfig = self.workdir / "kubeconfig"
        write_kubeconfig(self.kubeconfig, self.server, pki / "ca.crt", self.admin_token, "admin")

        def default_namespace() -> bool:
            return self.kubectl("get", "namespace", "default", check=False).returncode == 0

        self._wait("kube-apiserver", default_namespace, 30)

    def _wait_apiserver(self, pki: Path) -> None:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))

        def ready() -> bool:
            req = urllib.request.Request(f"{self.server}/readyz",
                                         headers={"Authorization": f"Bearer {self.admin_token}"})
            return urllib.request.urlopen(req, context=ctx, timeout=2).status == 200

        self._wait("kube-apiserver", ready, 90)

    def restart_apiserver(self, down_seconds: float = 0.0) -> None:
        """Stops kube-apiserver (etcd keeps the state), waits, starts it again on the same
        address and returns once it is ready: clients see their watches end and their
        requests refused meanwhile."""
        terminate(self.processes["kube-apiserver"], 30)
        time.sleep(down_seconds)
        self._spawn("kube-apiserver", self._apiserver_args)
        self._wait_apiserver(self.workdir / "pki")

    def pause_etcd(self) -> None:
        """SIGSTOP: etcd stops answering (a stalled disk or a partitioned member)."""
        self.processes["etcd"].send_signal(signal.SIGSTOP)

    def resume_etcd(self) -> None:
        self.processes["etcd"].send_signal(signal.SIGCONT)

    def _start_controllers(self, pki: Path) -> None:
        kc = str(self.kubeconfig)
        auth = [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}", "--leader-elect=false",
                "--bind-address=127.0.0.1"]
        self._spawn("kube-controller-manager", [
            *auth, f"--secure-port={free_port()}", "--controllers=*",
            # HPAs (tests/cluster/test_scaling.py) act within a second, not 15.
            "--horizontal-pod-autoscaler-sync-period=1s",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--use-service-account-credentials=false",
            "--concurrent-gc-syncs=20", "--v=1"])
        self._spawn("kube-scheduler", [*auth, f"--secure-port={free_port()}", "--v=1"])
        stages = []
        for stage in [*(self.share_dir / "kwok-stages" / s for s in KWOK_STAGES),
                      *write_stages(self.workdir / "kwok-stages", self.load_seconds)]:
            stages += ["-c", str(stage)]
        self._spawn("kwok", [
            f"--kubeconfig={kc}", "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds=40", "--cidr=10.1.0.1/16", "--node-ip=10.0.0.1",
            "--server-address=", *stages])
        # The default ServiceAccount appearing proves the controller-manager works.
        self._wait("kube-controller-manager", lambda: self.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0, 60)

    def _register_nodes(self) -> None:
        manifest = "\n---\n".join(yaml.safe_dump(h200_node(f"h200-{i}"))
                                  for i in range(self.nodes))
        self.kubectl("apply", "-f", "-", input=manifest)

        def all_ready() -> bool:
            out = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)
            ready = [n for n in out["items"] for c in n["status"].get("conditions", [])
                     if c["type"] == "Ready" and c["status"] == "True"]
            return len(ready) == self.nodes

        self._wait("kwok", all_ready, 60)

    def add_loopback_node(self, name: str, pod_cidr_octet: int,
                          labels: dict[str, str] | None = None,
                          capacity: dict[str, str] | None = None,
                          taints: list[dict] | None = None) -> dict[str, Any]:
        """A node whose pods run for real on this machine, under a PodRunner (see
        tests/cluster/pod_runner.py, loopback_node): kwok leaves it alone. Ready at once; a
        PodRunner must renew its heartbeat within the node monitor grace period."""
        node, status = loopback_node(name, pod_cidr_octet, labels, capacity, taints)
        self.kubectl("create", "-f", "-", input=json.dumps(node))
        self.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                     "-p", json.dumps(status))
        return json.loads(self.kubectl("get", "node", name, "-o", "json").stdout)

    # -- helpers

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.bin_dir / "kubectl"),
                               f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def helm(self, *args: str, check: bool = True, kubeconfig: Path | None = None
             ) -> subprocess.CompletedProcess:
        env = {**os.environ, "HELM_CACHE_HOME": str(self.workdir / "helm-cache"),
               "HELM_CONFIG_HOME": str(self.workdir / "helm-config"),
               "HELM_DATA_HOME": str(self.workdir / "helm-data")}
        if not (self.bin_dir / "helm").is_file():
            raise ControlPlaneError(f"no helm in {self.bin_dir}: run {BUILD_SCRIPT}")
        proc = subprocess.run([str(self.bin_dir / "helm"),
                               f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
                              capture_output=True, text=True, timeout=300, env=env)
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"helm {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def version(self) -> str:
        return json.loads(self.kubectl("version", "-o", "json").stdout)["serverVersion"][
            "gitVersion"]

    def stop(self) -> None:
        # Reverse start order: kwok, scheduler, controller-manager, apiserver, etcd.
        for name in reversed(list(self.processes)):
            terminate(self.processes[name], 10)
        self.processes.clear()
        if getattr(self, "_own_workdir", False) and self.workdir and not os.environ.get(
                "LONGCTX_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)


def main() -> None:
    """`python -m tests.cluster.controlplane`: start it and wait (Ctrl-C stops it)."""
    cp = ControlPlane().start()
    print(f"export KUBECONFIG={cp.kubeconfig}")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cp.stop()


if __name__ == "__main__":
    main()
