"""How many requests a draining engine pod still holds, read from its vLLM `/metrics`.

A drain (a rollout's old revision, the pods a scale-down removes) need not last its whole
window once the pods hold no request. The operator reads what the llm-d endpoint picker
and the PodMonitor read: each engine rank's vLLM HTTP port (the pod's `vllm-<rank>`
container ports) at `http://<pod IP>:<port>/metrics`, and sums `vllm:num_requests_running`
and `vllm:num_requests_waiting` (a decode request waiting for its KV is waiting, not
running). A pod counts as idle when every rank reports 0, or when it cannot be reached and
is not Ready (its engine is gone, and its requests with it). A Ready pod that cannot be
scraped is never idle: the drain then lasts its window. `LONGCTX_ENGINE_METRICS_NETWORKS`
(comma-separated CIDRs; any address when unset) limits the pod IPs the operator connects
to; a pod outside them counts as one that cannot be scraped.

Between a request's prefill leg and its decode leg both engines report 0 for a moment, so
one look proves nothing: a pod is drained only after it has been idle at two looks at
least rollout.IDLE_CONFIRM_SECONDS apart (IdleTracker keeps since when). The tracker lives
in the operator's memory; a restarted operator looks again, one more interval.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from prometheus_client.parser import text_string_to_metric_families

# What a request in flight shows up as on an engine (vLLM's gauges, per engine rank).
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
ENGINE_PORT_PREFIX = "vllm-"      # builders/engine.py names each rank's HTTP port so
SCRAPE_TIMEOUT_SECONDS = 2.0
PARALLEL_SCRAPES = 16


def in_flight(text: str) -> float:
    """The requests an engine's metrics page counts as running or waiting."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in IN_FLIGHT_METRICS:
                total += sample.value
    return total


def engine_ports(pod: dict[str, Any]) -> list[int]:
    return [p["containerPort"] for c in (pod.get("spec") or {}).get("containers", [])
            for p in c.get("ports") or [] if p.get("name", "").startswith(ENGINE_PORT_PREFIX)]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


NETWORKS_ENV = "LONGCTX_ENGINE_METRICS_NETWORKS"


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


def pod_in_flight(pod: dict[str, Any], timeout: float = SCRAPE_TIMEOUT_SECONDS
                  ) -> Optional[float]:
    """Requests in flight on every rank of the pod; None when a rank cannot be read."""
    ip = (pod.get("status") or {}).get("podIP")
    ports = engine_ports(pod)
    if not ip or not ports or not may_scrape(ip):
        return None
    total = 0.0
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout) as resp:
                total += in_flight(resp.read().decode())
        except (OSError, ValueError, urllib.error.URLError):
            return None
    return total


def pod_idle(pod: dict[str, Any], timeout: float = SCRAPE_TIMEOUT_SECONDS) -> bool:
    """Whether the pod holds no request (see the module docstring)."""
    count = pod_in_flight(pod, timeout)
    return count == 0 if count is not None else not _ready(pod)


class IdleTracker:
    """Since when each pod (by uid) of one CR has been seen idle at every look."""

    def __init__(self) -> None:
        self._since: dict[str, datetime.datetime] = {}

    def look(self, pods: list[dict[str, Any]], now: datetime.datetime) -> dict[str, float]:
        """Scrape `pods` now: {pod name: seconds it has been idle}, busy pods left out.
        Only these pods are remembered: one that drains again later starts afresh."""
        since: dict[str, datetime.datetime] = {}
        out: dict[str, float] = {}
        # At most one timeout's wait however many pods drain, not one per pod.
        with ThreadPoolExecutor(min(len(pods), PARALLEL_SCRAPES) or 1) as pool:
            idle = list(pool.map(pod_idle, pods))
        for pod, is_idle in zip(pods, idle):
            if not is_idle:
                continue
            uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
            since[uid] = self._since.get(uid, now)
            out[pod["metadata"]["name"]] = (now - since[uid]).total_seconds()
        self._since = since
        return out
