"""The upstream endpoint picker as a local process against the test control plane.

The binary is the Gateway API Inference Extension EPP (tools/build-epp.sh --upstream), the
code llm-d-router's picker derives from. It runs with the credentials of a ServiceAccount
(a TokenRequest token in a kubeconfig of its own) and listens on loopback ports only.
Used by tests/cluster/test_router.py and tests/cluster/test_prefix_reuse.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from longctx_operator.controller.builders.picker import PICKER_HEALTH_SERVICE
from tests.cluster.pod_process import grpc_health_serving
from tests.cluster.processes import free_port
from tests.conftest import REPO, wait_for



def upstream_picker() -> Path:
    """The upstream GIE endpoint picker binary (built, or reused, by tools/build-epp.sh)."""
    proc = subprocess.run(["bash", str(REPO / "tools" / "build-epp.sh"), "--upstream"],
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        pytest.fail(f"the upstream EPP could not be built (tools/build-epp.sh --upstream, which "
                    f"`make test` runs first): {proc.stderr.strip()[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def picker_kubeconfig(cluster, namespace: str, service_account: str, directory: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the picker's ServiceAccount."""
    token = cluster.kubectl("create", "token", service_account, "-n", namespace,
                            "--duration=10m").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    clus = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    assert clus["cluster"]["server"].startswith("https://127.0.0.1:")
    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "longctx", "cluster": clus["cluster"]}],
              "users": [{"name": service_account, "user": {"token": token}}],
              "contexts": [{"name": "epp", "context": {"cluster": "longctx",
                                                       "user": service_account,
                                                       "namespace": namespace}}],
              "current-context": "epp"}
    path = directory / f"{service_account}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Picker:
    proc: subprocess.Popen
    log_path: Path
    grpc_port: int
    health_port: int

    def wait_serving(self, timeout: float = 90) -> None:
        """Until its gRPC health on 127.0.0.1 says SERVING; fails with its log if it exits."""
        def serving():
            if self.proc.poll() is not None:
                raise AssertionError(f"the picker exited with {self.proc.returncode}: "
                                     f"{self.log_path.read_text()[-4000:]}")
            return grpc_health_serving("127.0.0.1", self.health_port, PICKER_HEALTH_SERVICE, 2)

        wait_for(serving, timeout, "the picker's gRPC health SERVING on 127.0.0.1", interval=1)


@contextlib.contextmanager
def picker_process(binary: Path, args: list[str], kubeconfig: Path, namespace: str,
                   pool: str, directory: Path) -> Iterator[Picker]:
    """A picker binary for `pool` as a subprocess with loopback ports and the given
    credentials. Only this process is ever signalled (its own session)."""
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    log_path = directory / f"{binary.parent.name}-{pool}.log"
    env = {"KUBECONFIG": str(kubeconfig), "NAMESPACE": namespace, "POD_NAME": "epp-test",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(directory)}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(binary), f"--pool-name={pool}", f"--pool-namespace={namespace}",
             "--pool-group=inference.networking.k8s.io", f"--grpc-port={grpc_port}",
             f"--grpc-health-port={health_port}", f"--metrics-port={metrics_port}",
             "--secure-serving=false", "--metrics-endpoint-auth=false", "--tracing=false", *args],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            yield Picker(proc, log_path, grpc_port, health_port)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
