"""Kopf handlers: thin. Every event of a LongContextDeployment or of one of its children
asks for one level-based reconcile of that CR; bursts of events are coalesced. A child's
event is put into the watch cache (cache.py) before the reconcile reads it.

No handler stores progress or adds finalizers: children are garbage-collected through
their ownerReferences, and the status is recomputed from the children each time.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
import time
from collections import Counter
from typing import Any, Callable

import kopf

from longctx_engine import contract

from . import metrics, rollout
from .cache import Caches
from .kube import Kube, KubeError
from .reconcile import reconcile

log = logging.getLogger(__name__)
MANAGED = {contract.MANAGED_BY_LABEL: contract.FIELD_MANAGER}
# How long the startup waits for the caches' first lists before serving events anyway
# (reads fall back to the API server until a kind is listed).
CACHE_SYNC_SECONDS = 30


class Coalescer:
    """Runs at most one reconcile per CR at a time; requests during a run cause one rerun."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[tuple[str, str]] = set()
        self._pending: set[tuple[str, str]] = set()

    def run(self, key: tuple[str, str], fn: Callable[[], None]) -> None:
        with self._lock:
            if key in self._running:
                self._pending.add(key)
                return
            self._running.add(key)
        try:
            while True:
                fn()
                with self._lock:
                    if key not in self._pending:
                        return
                    self._pending.discard(key)
        finally:
            with self._lock:
                self._running.discard(key)


class Retries:
    """Kopf does not retry event handlers: a failed reconcile is retried here, with backoff,
    until one succeeds (a later event reconciles earlier and resets the backoff)."""

    def __init__(self, first: float = 2.0, cap: float = 300.0) -> None:
        self._lock = threading.Lock()
        self._timers: dict[tuple[str, str], threading.Timer] = {}
        self._delays: dict[tuple[str, str], float] = {}
        self.first, self.cap = first, cap

    def schedule(self, key: tuple[str, str], fn: Callable[[], None]) -> float:
        with self._lock:
            delay = min(self._delays.get(key, self.first / 2) * 2, self.cap)
            self._delays[key] = delay
            if key not in self._timers:
                timer = threading.Timer(delay, contextvars.copy_context().run, (self._fire, key, fn))
                timer.daemon = True
                self._timers[key] = timer
                timer.start()
            return delay

    def _fire(self, key: tuple[str, str], fn: Callable[[], None]) -> None:
        with self._lock:
            self._timers.pop(key, None)
        fn()

    def succeeded(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._delays.pop(key, None)

    def cancel_all(self) -> None:
        with self._lock:
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()


class Wakeups:
    """Reconciles asked for at a time, not by an event: the end of a drain window, the
    deadline of a new revision's load. One timer per CR, the earliest wins. Timers run in
    the scheduling handler's context, where Kopf's event poster lives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timers: dict[tuple[str, str], tuple[float, threading.Timer]] = {}

    def at(self, key: tuple[str, str], delay: float, fn: Callable[[], None]) -> None:
        due = time.monotonic() + delay
        with self._lock:
            current = self._timers.get(key)
            if current is not None and current[0] <= due:
                return
            if current is not None:
                current[1].cancel()
            timer = threading.Timer(delay, contextvars.copy_context().run, (self._fire, key, fn))
            timer.daemon = True
            self._timers[key] = (due, timer)
            timer.start()

    def _fire(self, key: tuple[str, str], fn: Callable[[], None]) -> None:
        with self._lock:
            self._timers.pop(key, None)
        fn()

    def cancel_all(self) -> None:
        with self._lock:
            for _, timer in self._timers.values():
                timer.cancel()
            self._timers.clear()


class State:
    kube: Kube | None = None
    coalescer = Coalescer()
    retries = Retries()
    wakeups = Wakeups()
    phases: dict[tuple[str, str], str] = {}
    rollouts: dict[tuple[str, str], str] = {}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = int(os.environ.get("LONGCTX_WATCH_SERVER_TIMEOUT", "300"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.networking.request_timeout = 60
    settings.execution.max_workers = int(os.environ.get("LONGCTX_WORKERS", "8"))
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    # How long a killed leader's peering record blocks the next replica (Kopf: 60 s).
    settings.peering.lifetime = int(os.environ.get("LONGCTX_PEERING_LIFETIME", "60"))
    State.kube = Kube.from_environment()
    namespaces = tuple(n for n in os.environ.get("LONGCTX_NAMESPACES", "").split(",") if n)
    State.kube.caches = Caches(State.kube, namespaces)
    State.kube.caches.start()
    if not State.kube.caches.wait_synced(CACHE_SYNC_SECONDS):
        log.warning("watch caches not synced after %d s; reading from the API server until "
                    "they are", CACHE_SYNC_SECONDS)
    port = os.environ.get("LONGCTX_METRICS_PORT")
    if port:
        metrics.serve(int(port), os.environ.get("LONGCTX_METRICS_ADDRESS", "127.0.0.1"))


@kopf.on.cleanup()
def stop(**_: Any) -> None:
    State.retries.cancel_all()
    State.wakeups.cancel_all()
    if State.kube is not None and State.kube.caches is not None:
        State.kube.caches.stop()


def reconcile_named(namespace: str, name: str, logger: logging.Logger) -> None:
    """Reads the CR fresh and reconciles it (or does nothing if it is gone)."""
    kube = State.kube
    assert kube is not None, "the startup handler did not run"

    def once() -> None:
        cr = kube.get(contract.API_VERSION, contract.KIND, namespace, name)
        if cr is None or cr["metadata"].get("deletionTimestamp"):
            State.phases.pop((namespace, name), None)
            State.rollouts.pop((namespace, name), None)
            _export_phases()
            return
        key = (namespace, name)
        try:
            outcome = reconcile(kube, cr)
        except KubeError as exc:
            delay = State.retries.schedule(key, lambda: reconcile_named(namespace, name, logger))
            kopf.event(cr, type="Warning", reason="ReconcileFailed",
                       message=f"{exc}; retrying in {delay:.0f} s")
            logger.error("%s/%s: %s; retrying in %.0f s", namespace, name, exc, delay)
            return
        State.retries.succeeded(key)
        if outcome.wake_after is not None:
            State.wakeups.at(key, outcome.wake_after,
                             lambda: reconcile_named(namespace, name, logger))
        for type_, reason, message in outcome.events:
            kopf.event(cr, type=type_, reason=reason, message=message)
            logger.info("%s/%s %s: %s", namespace, name, reason, message)
        State.phases[(namespace, name)] = outcome.phase
        if outcome.rollout_phase:
            State.rollouts[(namespace, name)] = outcome.rollout_phase
        _export_phases()

    State.coalescer.run((namespace, name), once)


def _export_phases() -> None:
    counts = Counter(State.phases.values())
    for phase in ("Pending", "Progressing", "Ready", "Degraded", "Refused"):
        metrics.CRS_BY_PHASE.labels(phase=phase).set(counts.get(phase, 0))
    rollouts = Counter(State.rollouts.values())
    for phase in rollout.PHASES:
        metrics.ROLLOUTS_BY_PHASE.labels(phase=phase).set(rollouts.get(phase, 0))


@kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL)
def deployment_event(type: str, namespace: str, name: str, logger: logging.Logger,
                     **_: Any) -> None:
    if type == "DELETED":
        State.phases.pop((namespace, name), None)
        State.rollouts.pop((namespace, name), None)
        _export_phases()
        return
    reconcile_named(namespace, name, logger)


def _child_event(type: str, body: kopf.Body, namespace: str, labels: dict[str, str],
                 logger: logging.Logger, **_: Any) -> None:
    caches = State.kube.caches if State.kube is not None else None
    store = caches.stores.get(body.get("kind", "")) if caches is not None else None
    if store is not None:
        obj = json.loads(json.dumps(dict(body)))
        store.remove(obj) if type == "DELETED" else store.upsert(obj)
    cr_name = labels.get(contract.INSTANCE_LABEL)
    if cr_name:
        reconcile_named(namespace, cr_name, logger)


for _kind in contract.WATCHED_KINDS:
    kopf.on.event(_kind.group, _kind.version, _kind.plural, labels=MANAGED,
                  id=f"child-{_kind.plural}")(_child_event)
