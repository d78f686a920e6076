"""`longctx operator` as a child process of a test or benchmark, bound to 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.cluster.controlplane import REPO
from tests.cluster.pod_network import POD_NETWORK
from tests.cluster.processes import die_with_parent, free_port


class OperatorProcess:
    """Started against `kubeconfig` with `args` added to its command line and `env` to its
    environment; its output goes to `log` (appended, so a restart keeps the history). Only
    this process is signalled, and it dies with its parent."""

    def __init__(self, kubeconfig: Path, log: Path, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.kubeconfig, self.log, self.args, self.env = kubeconfig, log, args, env or {}
        self.metrics_port, self.health_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in
                                             ("core", "engine", "operator", "kernels", ".")),
               # Only the loopback pods' engines run; kwok's pod IPs are not local.
               "LONGCTX_ENGINE_METRICS_NETWORKS": str(POD_NETWORK),
               **self.env}
        env.pop("LONGCTX_METRICS_PORT", None)
        env.pop("KUBERNETES_SERVICE_HOST", None)   # inside a pod: not its in-cluster config
        command = [sys.executable, "-m", "longctx_operator.cli", "operator",
                   f"--metrics-port={self.metrics_port}", "--metrics-address=127.0.0.1",
                   f"--health-port={self.health_port}", "--health-address=127.0.0.1",
                   *self.args]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """Whether its /healthz answers, which Kopf serves once the startup handler has run
        (the caches listed, the rules compiled); fails when the operator exited."""
        assert self.alive, f"the operator exited:\n{self.tail()}"
        try:
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            return urllib.request.urlopen(url, timeout=2).status == 200
        except OSError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 15) -> None:
        """SIGTERM, and SIGKILL if it has not stopped within `grace` seconds (it may still be
        finishing reconciles)."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
