"""The loopback kubelet's pod network (tests/cluster/pod_runner.py), as a bridge CNI builds one.

Each pod has a network namespace of its own, held by its sandbox process: one veth pair
whose pod end is `eth0` (address in POD_NETWORK, default route via the bridge) and whose
host end is a port of the harness's bridge BRIDGE, which holds BRIDGE_IP. Programs that bind
the wildcard address therefore work unmodified, each pod's port 8000 is its own, and pods,
the host and the pods of other loopback nodes reach each other over the bridge.

Nothing is routed off the machine: the harness never enables IP forwarding nor adds NAT,
so a packet for any address outside the bridge's network goes nowhere. Inside a pod,
127.0.0.1 is the pod's own loopback; the API server is reached at BRIDGE_IP (ApiRelay).

The tool is iproute2's `ip` (installed with the system; two `ip -batch` processes per pod)
rather than pyroute2, which would be one more package in the test environment for the same
six netlink requests.

Several test sessions may run on one machine at once: they share the bridge (created by
the first, removed by the last, under a lock) and reserve pod IPs in a machine-wide
registry, so two sessions never give one address to two pods.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.cluster.pod_process import SYSTEM_PATH

POD_NETWORK = ipaddress.ip_network("198.18.0.0/15")   # RFC 2544's range: never routed
BRIDGE = "longctx-pods"
BRIDGE_IP = "198.18.0.1"
STATE_DIR = Path("/run/longctx-harness")   # the bridge lock and the pod IP registry
IP = shutil.which("ip", path=SYSTEM_PATH)
NSENTER = shutil.which("nsenter", path=SYSTEM_PATH)
NETNS_GONE_TIMEOUT = 30.0   # for a pod's processes to exit and its veth to go


class PodNetworkError(RuntimeError):
    """The pod network could not be set up; the message says what failed."""


def node_pod_cidr(octet: int) -> str:
    """A loopback node's podCIDR: the /24 of POD_NETWORK numbered `octet`."""
    if not 0 <= octet <= 255:
        raise ValueError(f"pod_cidr_octet {octet} is not in 0..255")
    return f"198.18.{octet}.0/24"


def in_pod_network(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in POD_NETWORK
    except ValueError:
        return False


def veth_name(uid: str) -> str:
    """The host end of a pod's veth pair (15 characters at most, as Linux allows)."""
    return f"lcv{uid.replace('-', '')[:8]}"


def _ip_batch(commands: list[str], netns_pid: int | None = None) -> None:
    if IP is None or NSENTER is None:
        raise PodNetworkError("the loopback kubelet's pod networks need `ip` (Debian package "
                              "iproute2) and `nsenter` (util-linux), run as root")
    argv = [IP, "-batch", "-"]
    if netns_pid is not None:
        argv = [NSENTER, f"--target={netns_pid}", "--net", "--", *argv]
    proc = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True,
                          text=True, timeout=20)
    if proc.returncode != 0:
        where = f"in the namespace of pid {netns_pid}" if netns_pid else "on the host"
        raise PodNetworkError(f"ip {where} failed ({'; '.join(commands)}): "
                              f"{proc.stderr.strip()}")


@contextmanager
def _machine_lock() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_inode(pid: int) -> int:
    """The inode of a process's network namespace: what identifies a pod's namespace."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


HOST_NETNS = netns_inode(os.getpid())


class PodNetwork:
    """The bridge, one veth pair per pod, and the pod IPs this process reserved."""

    def __init__(self) -> None:
        self.registry = STATE_DIR / "ips"
        self.user = STATE_DIR / "users" / f"{os.getpid()}-{id(self)}"

    # -- the bridge

    def open(self) -> None:
        """Creates the bridge with BRIDGE_IP unless another session already did, and
        registers this runner as one of its users."""
        if IP is None or NSENTER is None:
            raise PodNetworkError("the loopback kubelet's pod network needs iproute2's `ip` "
                                  "and util-linux's `nsenter`: apt-get install iproute2 "
                                  "util-linux")
        with _machine_lock():
            self.user.parent.mkdir(parents=True, exist_ok=True)
            self.user.touch()
            if not Path(f"/sys/class/net/{BRIDGE}").exists():
                _ip_batch([f"link add {BRIDGE} type bridge",
                           f"addr add {BRIDGE_IP}/{POD_NETWORK.prefixlen} dev {BRIDGE}",
                           f"link set {BRIDGE} up"])

    def close(self) -> None:
        """Removes the bridge when no other live runner uses it and no pod is attached."""
        with _machine_lock():
            self.user.unlink(missing_ok=True)
            users = []
            for user in self.user.parent.iterdir():
                if _alive(int(user.name.partition("-")[0])):
                    users.append(user)
                else:   # a killed session's
                    user.unlink()
            ports = Path(f"/sys/class/net/{BRIDGE}/brif")
            if not users and ports.exists() and not any(ports.iterdir()):
                _ip_batch([f"link del {BRIDGE}"])

    # -- pod IPs, machine-wide

    def reserve(self, ip: str) -> bool:
        """Takes `ip` for this process unless a live process holds it."""
        with _machine_lock():
            self.registry.mkdir(parents=True, exist_ok=True)
            path = self.registry / ip
            try:
                holder = int(path.read_text() or 0)
            except (FileNotFoundError, ValueError):
                holder = 0
            if holder and _alive(holder):
                return False
            path.write_text(str(os.getpid()))
            return True

    def unreserve(self, ip: str) -> None:
        with _machine_lock():
            path = self.registry / ip
            try:
                if int(path.read_text() or 0) == os.getpid():
                    path.unlink()
            except (FileNotFoundError, ValueError):
                pass

    def reserved(self, ip: str) -> bool:
        """Whether this process holds `ip` (for tests)."""
        try:
            return int((self.registry / ip).read_text() or 0) == os.getpid()
        except (FileNotFoundError, ValueError):
            return False

    # -- one pod

    def attach(self, uid: str, sandbox_pid: int, ip: str) -> None:
        """The pod's veth pair: `eth0` in the sandbox's namespace with `ip`, the host end
        a port of the bridge, both up (a port left down fails nothing loudly: connections
        just time out, hence the check)."""
        host = veth_name(uid)
        if netns_inode(sandbox_pid) == HOST_NETNS:
            raise PodNetworkError(f"the sandbox of pod {uid} (pid {sandbox_pid}) is in the "
                                  "host's network namespace")
        _ip_batch([f"link add {host} type veth peer name eth0 netns {sandbox_pid}",
                   f"link set {host} master {BRIDGE} up"])
        _ip_batch(["link set lo up", f"addr add {ip}/{POD_NETWORK.prefixlen} dev eth0",
                   "link set eth0 up", f"route add default via {BRIDGE_IP}"], sandbox_pid)
        master = Path(f"/sys/class/net/{host}/master")
        if not master.exists() or master.resolve().name != BRIDGE:
            raise PodNetworkError(f"veth {host} of pod {uid} is not a port of {BRIDGE}")

    def detach(self, uid: str, netns: int | None, timeout: float = NETNS_GONE_TIMEOUT) -> bool:
        """After the pod's processes were stopped: SIGKILLs, by PID, whatever still runs in
        its network namespace (a child that left its container's process group), waits for
        those PIDs to exit, then deletes the veth pair. The namespace itself may outlive
        them a while (the kernel keeps it for the retransmissions of sockets closed to peers
        already gone), but without `eth0` it holds no address. False if a process or the
        veth outlived `timeout`: the pod's IP must then not be reused."""
        deadline = time.monotonic() + timeout
        if netns is not None and netns != HOST_NETNS:
            while pids := pids_in_netns(netns):
                if time.monotonic() > deadline:
                    return False
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.05)
        veth = Path(f"/sys/class/net/{veth_name(uid)}")
        if veth.exists():
            subprocess.run([IP, "link", "del", veth.name], capture_output=True, timeout=20)
        while veth.exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


def pids_in_netns(netns: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == netns:
                    out.append(int(entry))
            except OSError:   # gone meanwhile, or a kernel thread
                pass
    return out


# ------------------------------------------------------------------ the API server for pods


class ApiRelay:
    """The API server as pods reach it: a TCP relay listening on BRIDGE_IP at the API
    server's own port, forwarding each connection to the API server on loopback (TLS passes
    through; the serving certificate covers BRIDGE_IP). It binds that exact address, never
    the wildcard. One per port in this process, shared by the PodRunners that use it."""

    _shared: dict[int, "ApiRelay"] = {}
    _lock = threading.Lock()

    def __init__(self, port: int, upstream: str):
        self.port, self.upstream, self.users = port, upstream, 0
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((BRIDGE_IP, port))
        except OSError as exc:
            self.listener.close()
            raise PodNetworkError(f"the API relay cannot listen on {BRIDGE_IP}:{port}: "
                                  f"{exc}") from exc
        self.listener.listen(64)
        threading.Thread(target=self._accept, daemon=True, name=f"api-relay-{port}").start()

    @classmethod
    def acquire(cls, port: int, upstream: str) -> "ApiRelay":
        with cls._lock:
            relay = cls._shared.get(port)
            if relay is None:
                relay = cls._shared[port] = cls(port, upstream)
            relay.users += 1
            return relay

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users == 0:
                self._shared.pop(self.port, None)
                try:   # wakes the accepting thread (close alone would not, on Linux)
                    self.listener.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:   # closed by release()
                return
            try:
                server = socket.create_connection((self.upstream, self.port), timeout=10)
            except OSError:   # the API server is restarting: the client sees a reset
                client.close()
                continue
            server.settimeout(None)
            _relay(client, server)


def _relay(client: socket.socket, server: socket.socket) -> None:
    """Copies both directions until both ended (one side may half-close and still read);
    then closes both sockets."""
    left = [2]
    lock = threading.Lock()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:   # a reset on either side ends both directions
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with lock:
            left[0] -= 1
            if left[0] == 0:
                client.close()
                server.close()

    for src, dst in ((client, server), (server, client)):
        threading.Thread(target=pump, args=(src, dst), daemon=True).start()
