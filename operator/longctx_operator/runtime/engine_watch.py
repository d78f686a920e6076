"""Reads every Ready engine pod's vLLM `/metrics` every few seconds, off the reconcile's
threads, and records a fault when one of its NIXL fault counters grows (controller/
data_path.py); the CR is then reconciled, which reports it.

The pods come from the operator's pod cache; each rank's port is read as the drain does
(controller/engine_load.py: the `vllm-<rank>` ports, LONGCTX_ENGINE_METRICS_NETWORKS, a 2 s
timeout), a few pods at a time. An engine that started after the watch did counts from zero;
the first read of an engine that was already running (this operator just started) is its
baseline. Only growth after that is a fault. A read that fails is
skipped: a pod that cannot be read is the engine restart the pod status reports.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from prometheus_client.parser import text_string_to_metric_families

from longctx_core import contract

from longctx_operator.controller import data_path
from longctx_operator.controller.engine_load import (SCRAPE_TIMEOUT_SECONDS, engine_ports,
                                                     may_scrape)

log = logging.getLogger(__name__)
PERIOD_ENV = "LONGCTX_ENGINE_WATCH_SECONDS"
DEFAULT_PERIOD_SECONDS = 5.0
PARALLEL_READS = 8


def fault_counters(text: str) -> dict[str, float]:
    """The NIXL fault counters of one metrics page, summed over their labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in data_path.FAILURE_COUNTERS:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def read_pod(pod: dict[str, Any]) -> Optional[dict[str, float]]:
    """The pod's fault counters summed over its ranks; None when a rank cannot be read."""
    ip = (pod.get("status") or {}).get("podIP")
    ports = engine_ports(pod)
    if not ip or not ports or not may_scrape(ip):
        return None
    total: dict[str, float] = {}
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}/metrics",
                                        timeout=SCRAPE_TIMEOUT_SECONDS) as resp:
                counters = fault_counters(resp.read().decode())
        except (OSError, ValueError, urllib.error.URLError):
            return None
        for name, value in counters.items():
            total[name] = total.get(name, 0.0) + value
    return total


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


class EngineWatch(threading.Thread):
    """The periodic reads (a daemon thread). `pods()` gives the engine pods to read;
    `fault_seen(namespace, cr name)` asks for a reconcile."""

    def __init__(self, pods: Callable[[], list[dict[str, Any]]],
                 fault_seen: Callable[[str, str], None], period: float | None = None):
        super().__init__(daemon=True, name="engine-watch")
        self.pods, self.fault_seen = pods, fault_seen
        self.period = period if period is not None else float(
            os.environ.get(PERIOD_ENV, DEFAULT_PERIOD_SECONDS))
        self.stopping = threading.Event()
        self._last: dict[str, dict[str, float]] = {}   # by pod uid and restart count
        self._watching_since = datetime.datetime.now(datetime.timezone.utc)

    def run(self) -> None:
        with ThreadPoolExecutor(PARALLEL_READS, thread_name_prefix="engine-read") as pool:
            while not self.stopping.wait(self.period):
                try:
                    self.look(pool.map)
                except Exception:   # one bad look must not end the watch
                    log.exception("engine watch")

    def look(self, map_: Callable = map) -> list[data_path.Growth]:
        """Reads every Ready engine pod once; records and returns the counters that grew."""
        pods = [p for p in self.pods() if _ready(p)
                and (p["metadata"].get("labels") or {}).get(contract.INSTANCE_LABEL)]
        now = datetime.datetime.now(datetime.timezone.utc)
        seen: list[data_path.Growth] = []
        # Baselines of the pods still there; a pod not read this time keeps its last one.
        current = {k: self._last[k] for k in map(_instance_key, pods) if k in self._last}
        for pod, counters in zip(pods, map_(read_pod, pods)):
            if counters is None:
                continue
            key = _instance_key(pod)
            before = self._last.get(key)
            if before is None and _engine_started(pod) > self._watching_since:
                before = {}
            current[key] = counters
            if before is None:
                continue
            meta = pod["metadata"]
            cr = (meta["namespace"], meta["labels"][contract.INSTANCE_LABEL])
            role = meta["labels"].get(contract.COMPONENT_LABEL, "")
            grown = [data_path.Growth(meta["name"], role, metric, value - before.get(metric, 0.0),
                                      now)
                     for metric, value in counters.items() if value > before.get(metric, 0.0)]
            for growth in grown:
                data_path.RECORDED.add(cr, growth)
            if grown:
                seen += grown
                self.fault_seen(*cr)
        self._last = current
        return seen


def _engine_started(pod: dict[str, Any]) -> datetime.datetime:
    """When the pod's engine container last started (long ago when unknown)."""
    times = [datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
        if (s := ((cs.get("state") or {}).get("running") or {}).get("startedAt"))]
    return max(times, default=datetime.datetime.min.replace(tzinfo=datetime.timezone.utc))


def _instance_key(pod: dict[str, Any]) -> str:
    """A pod's engine instance: a restarted container starts its counters from zero."""
    restarts = sum(cs.get("restartCount", 0)
                   for cs in (pod.get("status") or {}).get("containerStatuses") or [])
    return f"{pod['metadata'].get('uid', pod['metadata']['name'])}/{restarts}"
