"""What the loopback kubelet (tests/cluster/pod_runner.py) reports of a pod: each
container's state and the pod's status, with the four conditions the kubelet owns and when
each last changed."""

from __future__ import annotations

import time
from pathlib import Path

from tests.cluster.pod_network import BRIDGE_IP

HOST_IP = BRIDGE_IP    # the node's address as its pods see it
MINE = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def log_tail(path: Path, offset: int, lines: int = 80, limit: int = 2048) -> str:
    """The kubelet's fallback termination message: the last lines of this run's log."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    return b"\n".join(data.splitlines()[-lines:])[-limit:].decode(errors="replace")


class ContainerRun:
    """One container's state as the kubelet reports it."""

    def __init__(self, spec: dict, kind: str):
        self.spec, self.kind, self.name = spec, kind, spec["name"]   # kind: init|sidecar|main
        self.state: dict = {"waiting": {"reason": "PodInitializing" if kind == "main"
                                        else "ContainerCreating"}}
        self.last_state: dict = {}
        self.restarts, self.started, self.ready, self.done = 0, False, False, False
        self.proc = None
        self.env: dict[str, str] = {}
        self.container_id = ""
        self.log_offset = 0

    def status(self) -> dict:
        s = {"name": self.name, "image": self.spec.get("image", ""),
             "imageID": f"loopback://{self.spec.get('image', '')}", "state": self.state,
             "lastState": self.last_state, "ready": self.ready, "started": self.started,
             "restartCount": self.restarts}
        return {**s, "containerID": self.container_id} if self.container_id else s


class PodConditions:
    """The kubelet's conditions of one pod, each with the time its status last changed."""

    def __init__(self) -> None:
        self.transitions: dict[str, tuple[str, str]] = {}

    def condition(self, kind: str, ok: bool, reason: str | None, message: str | None) -> dict:
        status = "True" if ok else "False"
        if self.transitions.get(kind, ("",))[0] != status:
            self.transitions[kind] = (status, now())
        cond = {"type": kind, "status": status, "lastProbeTime": None,
                "lastTransitionTime": self.transitions[kind][1]}
        return {**cond, "reason": reason, "message": message} if not ok and reason else cond

    def pod_status(self, phase: str, sandbox_up: bool, inits: list[ContainerRun],
                   mains: list[ContainerRun], ip: str | None, conditions: list[dict],
                   start_time: str, reason: str | None, message: str | None) -> dict:
        """The pod's status: its phase, the four conditions the kubelet owns beside the
        others (`conditions`), and its containers'."""
        terminal = phase in ("Succeeded", "Failed")
        pending_init = [r.name for r in inits if not (
            r.started if r.kind == "sidecar" else r.state.get("terminated", {}).get(
                "exitCode") == 0)]
        unready = [r.name for r in [*mains, *(r for r in inits if r.kind == "sidecar")]
                   if not r.ready]
        ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
        ready_msg = None if terminal else f"containers with unready status: [{' '.join(unready)}]"
        mine = [self.condition("PodReadyToStartContainers", sandbox_up and
                                not terminal, None, None),
                self.condition("Initialized", not pending_init, "ContainersNotInitialized",
                                f"containers with incomplete status: [{' '.join(pending_init)}]"),
                self.condition("ContainersReady", not unready and not terminal, ready_reason,
                                ready_msg),
                self.condition("Ready", not unready and not terminal, ready_reason, ready_msg)]
        others = [c for c in conditions if c["type"] not in MINE]
        status = {"phase": phase, "conditions": others + mine, "hostIP": HOST_IP,
                  "hostIPs": [{"ip": HOST_IP}], "startTime": start_time,
                  "reason": reason, "message": message,
                  "containerStatuses": [r.status() for r in mains]}
        if ip:
            status.update(podIP=ip, podIPs=[{"ip": ip}])
        if inits:
            status["initContainerStatuses"] = [r.status() for r in inits]
        return status
