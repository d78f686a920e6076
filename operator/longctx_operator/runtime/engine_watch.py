"""The operator's one reader of the engines' `/metrics`: every few seconds, off the
reconcile's threads, it reads each engine pod's ranks and keeps, per rank, the NIXL fault
counters and the requests in flight. Faults (controller/data_path.py) and the drain
(controller/engine_load.py) both read what it publishes; a reconcile never reads an engine.
It reads the client-facing endpoint's pods the same way (contract.ENDPOINT_PORT), whose
counters of answers continued and given up go to controller/answers.py.

The pods come from the operator's pod cache; each rank's port is its `vllm-<rank>`
container port, read at its pod IP inside LONGCTX_ENGINE_METRICS_NETWORKS with a 2 s
timeout, a few pods at a time. A rank's counters are compared with its own last read: the
baseline stays while the pod exists, whether or not it is Ready or could be read this time,
so a readiness flap never replays old counts as new faults. A rank whose engine restarted
(the pod's restart count moved, or a counter went down) counts from zero, and so does an
engine that started after the watch did; the first read of an engine that was already
running (this operator just started) is its baseline. A series the operator reads that a
rank does not export is a fault of its own (data_path.MissingSeries), held while it lasts.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

from prometheus_client.parser import text_string_to_metric_families

from longctx_core import contract

from longctx_operator.controller import answers, data_path, engine_load
from longctx_operator.controller.memory import Memory

log = logging.getLogger(__name__)
PERIOD_ENV = "LONGCTX_ENGINE_WATCH_SECONDS"
DEFAULT_PERIOD_SECONDS = 5.0
PARALLEL_READS = 8
# Every series the operator reads from an engine rank; each must be there.
READ_SERIES = (*data_path.FAILURE_COUNTERS, *engine_load.IN_FLIGHT_METRICS)
CR = tuple[str, str]
Values = dict[str, float]


def page_values(text: str, names: tuple[str, ...] = READ_SERIES) -> dict[str, float]:
    """The named series of one metrics page, each summed over its labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _get(url: str, parse: Callable[[str], Values]) -> Optional[Values]:
    try:
        with urllib.request.urlopen(url, timeout=engine_load.SCRAPE_TIMEOUT_SECONDS) as resp:
            return parse(resp.read().decode())
    except (OSError, ValueError, urllib.error.URLError):
        return None


def read_ranks(pod: dict[str, Any]) -> dict[int, Optional[Values]]:
    """{port: its series (None: it could not be read)} of an engine pod's ranks, or of an
    endpoint pod's one port; {} when the pod has no address the operator may read."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not engine_load.may_scrape(ip):
        return {}
    if _component(pod) == contract.ENDPOINT_COMPONENT:
        ports, parse = [contract.ENDPOINT_PORT], answers.page_counts
    else:
        ports, parse = engine_load.engine_ports(pod), page_values
    return {port: _get(f"http://{ip}:{port}/metrics", parse) for port in ports}


@dataclass(frozen=True)
class Baseline:
    """A rank's fault counters at its last read, and its pod's restart count then."""

    restarts: int
    counters: dict[str, float]


class EngineWatch(threading.Thread):
    """The periodic reads (a daemon thread). `pods()` gives the pods to read;
    `fault_seen(namespace, cr name)` asks for a reconcile; what it reads goes to the
    operator's `memory`."""

    def __init__(self, pods: Callable[[], list[dict[str, Any]]],
                 fault_seen: Callable[[str, str], None], memory: Memory,
                 period: float | None = None):
        super().__init__(daemon=True, name="engine-watch")
        self.pods, self.fault_seen = pods, fault_seen
        self.loads, self.recorded, self.answers = memory.loads, memory.recorded, memory.answers
        self.period = period if period is not None else float(
            os.environ.get(PERIOD_ENV, DEFAULT_PERIOD_SECONDS))
        self.stopping = threading.Event()
        self._baselines: dict[tuple[str, int], Baseline] = {}   # by pod uid and rank port
        self._missing_since: dict[tuple[str, int, str], datetime.datetime] = {}
        self._watching_since = datetime.datetime.now(datetime.timezone.utc)

    def run(self) -> None:
        with ThreadPoolExecutor(PARALLEL_READS, thread_name_prefix="engine-read") as pool:
            while not self.stopping.wait(self.period):
                try:
                    self.look(pool.map)
                except Exception:   # one bad look must not end the watch
                    log.exception("engine watch")

    def look(self, map_: Callable = map) -> list[data_path.Growth]:
        """Reads every engine and endpoint pod once; publishes the loads, records the
        counters that grew and the series missing, and returns the engines' growths."""
        pods = [p for p in self.pods() if _cr(p) is not None
                and _component(p) in (*contract.ROLES, contract.ENDPOINT_COMPONENT)]
        now = datetime.datetime.now(datetime.timezone.utc)
        uids = {engine_load.pod_uid(p) for p in pods}
        baselines = {k: b for k, b in self._baselines.items() if k[0] in uids}
        missing_since = {k: t for k, t in self._missing_since.items() if k[0] in uids}
        loads: dict[str, engine_load.PodLoad] = {}
        missing: dict[CR, list[data_path.MissingSeries]] = {}
        seen: list[data_path.Growth] = []
        touched: set[CR] = set()
        for pod, ranks in zip(pods, map_(read_ranks, pods)):
            cr, uid = _cr(pod), engine_load.pod_uid(pod)
            assert cr is not None
            before_all, after_all = self._compare(pod, ranks, baselines, missing_since, now)
            meta = pod["metadata"]
            missing.setdefault(cr, []).extend(
                data_path.MissingSeries(meta["name"], uid, port, series, since)
                for (u, port, series), since in sorted(missing_since.items()) if u == uid)
            if _component(pod) == contract.ENDPOINT_COMPONENT:
                answered = {k: v - before_all[k] for k, v in after_all.items()
                            if v > before_all[k]}
                if any(v is not None for v in ranks.values()):
                    self.answers.add(cr, answered)
                if answered:
                    touched.add(cr)
                continue
            in_flight = [sum(v.get(m, 0.0) for m in engine_load.IN_FLIGHT_METRICS)
                         if v is not None else None for v in ranks.values()]
            loads[uid] = engine_load.PodLoad(
                sum(in_flight) if ranks and None not in in_flight else None,  # type: ignore
                engine_load.ready(pod), now)
            grown = data_path.growths(meta["name"], _component(pod) or "", before_all,
                                      after_all, now)
            for growth in grown:
                self.recorded.add(cr, growth)
            if grown:
                seen += grown
                touched.add(cr)
        self._baselines, self._missing_since = baselines, missing_since
        self.loads.publish(loads)
        touched |= self.recorded.set_missing(missing)
        for cr in sorted(touched):
            self.fault_seen(*cr)
        return seen

    def _compare(self, pod: dict[str, Any], ranks: dict[int, Optional[Values]],
                 baselines: dict[tuple[str, int], Baseline],
                 missing_since: dict[tuple[str, int, str], datetime.datetime],
                 now: datetime.datetime) -> tuple[Values, Values]:
        """The pod's counters before and after, summed over the ranks read whose growth
        counts; records each rank's new baseline and the series it lacks."""
        uid, restarts = engine_load.pod_uid(pod), _restarts(pod)
        endpoint = _component(pod) == contract.ENDPOINT_COMPONENT
        before_all: Values = {}
        after_all: Values = {}
        for port, values in ranks.items():
            if values is None:
                continue    # its baseline, and what it lacked, stay for the next read
            for series in answers.SERIES if endpoint else READ_SERIES:
                if series in values:
                    missing_since.pop((uid, port, series), None)
                else:
                    missing_since.setdefault((uid, port, series), now)
            counters = values if endpoint else {
                m: v for m, v in values.items() if m in data_path.FAILURE_COUNTERS}
            before = self._before(pod, baselines.get((uid, port)), restarts, counters)
            baselines[(uid, port)] = Baseline(restarts, counters)
            if before is None:
                continue
            for metric, value in counters.items():
                after_all[metric] = after_all.get(metric, 0.0) + value
                before_all[metric] = before_all.get(metric, 0.0) + before.get(metric, 0.0)
        return before_all, after_all

    def _before(self, pod: dict[str, Any], baseline: Optional[Baseline], restarts: int,
                counters: dict[str, float]) -> Optional[dict[str, float]]:
        """The counts a rank's growth is measured from; None: this read is its baseline."""
        if baseline is None:
            return {} if _engine_started(pod) > self._watching_since else None
        if baseline.restarts != restarts or any(
                counters.get(m, 0.0) < v for m, v in baseline.counters.items()):
            return {}    # a new engine process counts from zero
        return baseline.counters


def _cr(pod: dict[str, Any]) -> Optional[CR]:
    meta = pod["metadata"]
    name = (meta.get("labels") or {}).get(contract.INSTANCE_LABEL)
    if not name or meta.get("deletionTimestamp"):
        return None   # a pod going away on purpose (a drain, a rollout) is not read
    return meta["namespace"], name


def _component(pod: dict[str, Any]) -> Optional[str]:
    return (pod["metadata"].get("labels") or {}).get(contract.COMPONENT_LABEL)


def _restarts(pod: dict[str, Any]) -> int:
    return sum(cs.get("restartCount", 0)
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def _engine_started(pod: dict[str, Any]) -> datetime.datetime:
    """When the pod's engine container last started (long ago when unknown)."""
    times = [datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
        if (s := ((cs.get("state") or {}).get("running") or {}).get("startedAt"))]
    return max(times, default=datetime.datetime.min.replace(tzinfo=datetime.timezone.utc))
