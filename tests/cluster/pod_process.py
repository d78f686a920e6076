"""The processes of a pod of the loopback kubelet (tests/cluster/pod_runner.py): its sandbox,
its containers, their stop, and probes. Its environment is pod_env.py's, its volumes
pod_volumes.py's.

Each pod gets a sandbox process (the pause container's role) holding a private mount, UTS
and network namespace: memory-backed emptyDirs are tmpfs mounts there, shared by every
container of the pod, and tests/cluster/pod_network.py gives the network namespace its
`eth0`. Each container enters it, unshares a mount namespace of its own, bind-mounts its
volumes at their mount paths and execs its command, so nothing is mounted on the host.
"""

from __future__ import annotations

import http.client
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = {t: shutil.which(t, path=SYSTEM_PATH) or t
         for t in ("unshare", "nsenter", "setpriv", "mount", "hostname", "sleep", "sh", "bash",
                   "mkdir", "dirname")}


class PodSetupError(RuntimeError):
    """The pod cannot start yet; `reason` is the kubelet's waiting reason for it."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _spawn(argv: list[str], env: dict[str, str] | None, log: Path | None, cwd: str = "/"
           ) -> subprocess.Popen:
    """In its own process group; SIGKILLed if the thread that started it dies (a test run
    killed mid-way leaves nothing running). Threads that spawn live until the process ends."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen([TOOLS["setpriv"], "--pdeathsig", "KILL", "--", *argv],
                                env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log:
            out.close()


def start_sandbox(hostname: str, tmpfs: dict[Path, int], log: Path) -> subprocess.Popen:
    """The pod's pause process: its namespaces hold the pod's hostname, tmpfs volumes (mount
    point -> size, 0 for no limit) and network (empty until the harness attaches the pod's
    veth)."""
    script = [f"{TOOLS['hostname']} {shlex.quote(hostname)}"]
    for mount_point, size_bytes in tmpfs.items():
        size = f",size={size_bytes}" if size_bytes else ""
        script.append(f"{TOOLS['mount']} -t tmpfs -o mode=1777{size} tmpfs "
                      f"{shlex.quote(str(mount_point))}")
    script.append(f"echo sandbox-ready; exec {TOOLS['sleep']} infinity")
    offset = log.stat().st_size if log.exists() else 0   # a retried sandbox appends
    proc = _spawn([TOOLS["unshare"], "--mount", "--uts", "--net", "--propagation", "private",
                   "--", TOOLS["sh"], "-ec", "\n".join(script)], {"PATH": SYSTEM_PATH}, log)
    deadline = time.monotonic() + 10
    while b"sandbox-ready" not in log.read_bytes()[offset:]:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc, 0)
            raise PodSetupError("CreateContainerError", f"pod sandbox failed: "
                                f"{log.read_text(errors='replace')[-500:]}")
        time.sleep(0.02)
    return proc


def start_container(sandbox_pid: int, argv: list[str], env: dict[str, str], cwd: str,
                    mounts: list[str], log: Path) -> subprocess.Popen:
    """nsenter the sandbox, unshare a mount namespace of the container's own, mount, exec:
    one process id all along, which is the container's process-group leader."""
    script = "\n".join([*mounts, 'exec "$@"'])
    return _spawn([TOOLS["nsenter"], f"--target={sandbox_pid}", "--mount", "--uts", "--net",
                   "--", TOOLS["unshare"], "--mount", "--propagation", "private", "--",
                   TOOLS["bash"], "-ec", script, "container", *argv], env, log, cwd)


def stop_process(proc: subprocess.Popen | None, grace: float) -> int | None:
    """SIGTERM to the process group, SIGKILL after `grace` seconds; the exit status."""
    if proc is None:
        return None
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    return proc.returncode


# ------------------------------------------------------------------ probes

# grpc.health.v1 HealthCheckResponse{status: SERVING}, encoded by hand (protobuf wire format:
# field 1, varint 1) so the harness needs only grpcio, not the generated health stubs.
GRPC_HEALTH_SERVING = b"\x08\x01"
GRPC_HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def grpc_health_request(service: str) -> bytes:
    """grpc.health.v1 HealthCheckRequest{service} (field 1, length-delimited)."""
    data = service.encode()
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def grpc_health_serving(host: str, port: int, service: str, timeout: float) -> bool:
    """One call of the standard gRPC health check, as the kubelet's grpc probe makes it: plain
    text (no TLS), success only for the answer SERVING."""
    import grpc

    with grpc.insecure_channel(f"{host}:{port}", options=[("grpc.enable_http_proxy", 0)]
                               ) as channel:
        try:
            answer = channel.unary_unary(GRPC_HEALTH_CHECK)(grpc_health_request(service),
                                                              timeout=timeout)
        except grpc.RpcError:
            return False
    return answer == GRPC_HEALTH_SERVING


def run_probe(probe: dict, c: dict, pod_ip: str, pid: int, env: dict[str, str]) -> bool:
    """One httpGet, tcpSocket, grpc or exec probe attempt, as the kubelet runs it."""
    timeout = probe.get("timeoutSeconds", 1)

    def port_of(spec: dict) -> int:
        port = spec["port"]
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        return next(p["containerPort"] for p in c.get("ports", []) if p.get("name") == port)

    try:
        if "httpGet" in probe:
            h = probe["httpGet"]
            cls = http.client.HTTPSConnection if h.get("scheme") == "HTTPS" else \
                http.client.HTTPConnection
            kw = {"context": ssl._create_unverified_context()} if h.get("scheme") == "HTTPS" else {}
            conn = cls(h.get("host") or pod_ip, port_of(h), timeout=timeout, **kw)
            try:
                conn.request("GET", h.get("path", "/"), headers={
                    "User-Agent": "kube-probe/1.37", **{x["name"]: x["value"]
                                                        for x in h.get("httpHeaders", [])}})
                return 200 <= conn.getresponse().status < 400
            finally:
                conn.close()
        if "tcpSocket" in probe:
            t = probe["tcpSocket"]
            with socket.create_connection((t.get("host") or pod_ip, port_of(t)), timeout):
                return True
        if "grpc" in probe:
            g = probe["grpc"]
            return grpc_health_serving(pod_ip, int(g["port"]), g.get("service", ""), timeout)
        if "exec" in probe:
            argv = [TOOLS["nsenter"], f"--target={pid}", "--mount", "--uts", "--net", "--",
                    *probe["exec"]["command"]]
            return subprocess.run(argv, env=env, capture_output=True, timeout=timeout,
                                  start_new_session=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired, http.client.HTTPException, StopIteration):
        return False
    return False
