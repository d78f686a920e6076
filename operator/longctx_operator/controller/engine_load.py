"""How many requests each engine pod holds, as the engine watch read it last
(runtime/engine_watch.py), and since when a draining pod has held none.

The watch reads what the llm-d endpoint picker and the PodMonitor read: each engine rank's
vLLM HTTP port (the pod's `vllm-<rank>` container ports) at
`http://<pod IP>:<port>/metrics`, and sums `vllm:num_requests_running` and
`vllm:num_requests_waiting` (a decode request waiting for its KV is waiting, not running).
A pod holds nothing when every rank reports 0, or when it cannot be read and is not Ready
(its engine is gone, and its requests with it). A Ready pod that cannot be read is never
idle: the drain then lasts its window. `LONGCTX_ENGINE_METRICS_NETWORKS` (comma-separated
CIDRs; any address when unset) limits the pod IPs the operator connects to; a pod outside
them counts as one that cannot be read.

A reconcile reads only the watch's last readings (`Loads`, in controller/memory.py), never
an engine: a slow engine never delays it. Between a request's prefill leg and its decode leg both engines report 0
for a moment, so one reading proves nothing: a pod is drained only after it was idle at two
readings at least rollout.IDLE_CONFIRM_SECONDS apart, both taken after the drain first
looked at it (IdleTracker). The tracker lives in the operator's memory; a restarted
operator looks again, one more interval.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional

# What a request in flight shows up as on an engine (vLLM's gauges, per engine rank).
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
ENGINE_PORT_PREFIX = "vllm-"      # builders/engine.py names each rank's HTTP port so
SCRAPE_TIMEOUT_SECONDS = 2.0
NETWORKS_ENV = "LONGCTX_ENGINE_METRICS_NETWORKS"


def engine_ports(pod: dict[str, Any]) -> list[int]:
    return [p["containerPort"] for c in (pod.get("spec") or {}).get("containers", [])
            for p in c.get("ports") or [] if p.get("name", "").startswith(ENGINE_PORT_PREFIX)]


def ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def metrics_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The networks whose pods the operator may scrape ([]: any); the operator checks them
    at start, so a bad value stops it with this message rather than a reconcile."""
    text = os.environ.get(NETWORKS_ENV, "")
    try:
        return [ipaddress.ip_network(n.strip()) for n in text.split(",") if n.strip()]
    except ValueError as exc:
        raise ValueError(f"{NETWORKS_ENV}={text!r}: {exc}; give comma-separated CIDRs such "
                         "as 10.0.0.0/8,fd00::/8, or leave it unset for any") from exc


def may_scrape(ip: str) -> bool:
    networks = metrics_networks()
    return not networks or any(ipaddress.ip_address(ip) in n for n in networks)


@dataclass(frozen=True)
class PodLoad:
    """One reading of a pod's ranks: requests in flight (None: a rank could not be read)."""

    in_flight: Optional[float]
    ready: bool
    read_at: datetime.datetime

    @property
    def idle(self) -> bool:
        return self.in_flight == 0 if self.in_flight is not None else not self.ready


class Loads:
    """The watch's last reading of each engine pod, by pod uid (written by the watch's
    thread, read by the reconciles')."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, PodLoad] = {}

    def publish(self, by_uid: dict[str, PodLoad]) -> None:
        """The readings of one look; pods the look did not list are forgotten."""
        with self._lock:
            self._by_uid = dict(by_uid)

    def of(self, pod: dict[str, Any]) -> Optional[PodLoad]:
        with self._lock:
            return self._by_uid.get(pod_uid(pod))



def pod_uid(pod: dict[str, Any]) -> str:
    return pod["metadata"].get("uid") or pod["metadata"]["name"]


class IdleTracker:
    """Since when each draining pod (by uid) of one CR has been idle at every reading."""

    def __init__(self) -> None:
        self._first_look: dict[str, datetime.datetime] = {}
        self._since: dict[str, datetime.datetime] = {}

    def look(self, pods: list[dict[str, Any]], now: datetime.datetime, loads: Loads
             ) -> dict[str, float]:
        """{pod name: seconds between the first and the last idle reading}, for the pods
        idle at every reading taken since the drain first looked at them; busy pods, and
        pods not read since, are left out. Only these pods are remembered: one that drains
        again later starts afresh."""
        first: dict[str, datetime.datetime] = {}
        since: dict[str, datetime.datetime] = {}
        out: dict[str, float] = {}
        for pod in pods:
            uid = pod_uid(pod)
            first[uid] = self._first_look.get(uid, now)
            reading = loads.of(pod)
            if reading is None or reading.read_at < first[uid] or not reading.idle:
                continue
            since[uid] = self._since.get(uid, reading.read_at)
            out[pod["metadata"]["name"]] = (reading.read_at - since[uid]).total_seconds()
        self._first_look, self._since = first, since
        return out
