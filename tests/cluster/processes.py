"""What the harness's local processes share: they die with the process that started them,
stop with a grace period, and listen on free loopback ports."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess


def die_with_parent() -> None:
    """Runs in the child before exec: kill it when the process that started it dies, so a
    killed test run leaves nothing running behind (Linux prctl PR_SET_PDEATHSIG). SIGKILL:
    kube-apiserver waits forever on SIGTERM once its etcd is gone, and the state is scratch."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def terminate(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
