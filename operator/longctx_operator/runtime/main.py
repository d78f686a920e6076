"""Kopf handlers: thin. Every event of a LongContextDeployment (from Kopf) or of one of its
children (from the children's watch caches, cache.py) asks for one level-based reconcile of
that CR; bursts of events are coalesced.

No handler stores progress or adds finalizers: children are garbage-collected through
their ownerReferences, and the status is recomputed from the children each time.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import kopf

from longctx_core import contract

from longctx_operator.controller import engine_load, rollout
from longctx_operator import metrics
from longctx_operator.runtime.cache import RELIST_BACKOFF_CAP, Caches
from longctx_operator.runtime.engine_watch import EngineWatch
from longctx_operator.runtime.kube import Kube, KubeError
from longctx_operator.controller.reconcile import reconcile

log = logging.getLogger(__name__)
Key = tuple[str, str]   # a CR's (namespace, name)
# How long the startup waits for the caches' first lists before serving events anyway
# (reads fall back to the API server until a kind is listed).
CACHE_SYNC_SECONDS = 30


class WorkQueue:
    """Reconciles CRs on a pool of worker threads, at most one run per CR at a time. A
    request for a CR already waiting joins that wait; one for a CR being reconciled queues
    one more run after it. A burst of events for one CR (its children being created, their
    statuses moving) thus costs one or two reconciles, not one per event. Each run happens
    in the context of the request that queued it, where Kopf's event poster lives."""

    def __init__(self, workers: int) -> None:
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="reconcile")
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        # Runs asked for during a run: the first request's context and time.
        self._again: dict[Key, tuple[contextvars.Context, Callable[[], None], float]] = {}

    def request(self, key: Key, fn: Callable[[], None]) -> None:
        with self._lock:
            if key in self._queued:
                return
            if key in self._running:
                self._again.setdefault(key, (contextvars.copy_context(), fn, time.monotonic()))
                return
            self._queued.add(key)
        self._pool.submit(contextvars.copy_context().run, self._work, key, fn, time.monotonic())

    def _work(self, key: Key, fn: Callable[[], None], requested: float) -> None:
        metrics.RECONCILE_QUEUE_SECONDS.observe(time.monotonic() - requested)
        with self._lock:
            self._queued.discard(key)
            self._running.add(key)
        try:
            fn()
        except Exception:   # the reconcile's own errors are handled inside fn
            log.exception("reconcile of %s/%s failed", *key)
        finally:
            with self._lock:
                self._running.discard(key)
                again = self._again.pop(key, None)
                if again is not None:
                    self._queued.add(key)
            if again is not None:
                context, rerun, requested = again
                self._pool.submit(context.run, self._work, key, rerun, requested)

    def idle(self) -> bool:
        with self._lock:
            return not (self._queued or self._running)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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
    kube: Kube | None = None      # reads through `caches`
    caches: Caches | None = None
    # The context of Kopf's event processing, which kopf.event() posts through (the startup
    # handler's lacks it): taken from the first CR event. A child change before that one
    # needs no reconcile of its own, since every CR's first event comes later.
    kopf_context: contextvars.Context | None = None
    queue: WorkQueue | None = None
    engine_watch: EngineWatch | None = None
    retries = Retries()
    wakeups = Wakeups()
    phases: dict[tuple[str, str], str] = {}
    cordoned: set[str] = set()   # the nodes last seen unschedulable
    rollouts: dict[tuple[str, str], str] = {}


class NoDiffBase(kopf.DiffBaseStorage):
    """Kopf builds a deep-copied "essence" of every object on every event, to diff it for
    change handlers. This operator has only event handlers, so the copy is skipped: it was
    most of the cost of an event."""

    def build(self, **_: Any) -> None:
        return None

    def fetch(self, **_: Any) -> None:
        return None

    def store(self, **_: Any) -> None:
        pass


class QuietEventHandlers(logging.Filter):
    """Drops Kopf's "Handler '...' succeeded." line: the event handlers run once per watch
    event of every child, so the line said nothing and was a measurable share of the cost
    of an event. Failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage().startswith(
            "Handler '") and record.getMessage().endswith("' succeeded."))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.INFO
    settings.persistence.diffbase_storage = NoDiffBase()
    logging.getLogger("kopf.objects").addFilter(QuietEventHandlers())
    settings.watching.server_timeout = int(os.environ.get("LONGCTX_WATCH_SERVER_TIMEOUT", "300"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.networking.request_timeout = 60
    # Kopf's watch of the CRs retries a refused request with delays growing to 21 s (and
    # starts over after the eighth): an API server back from a restart was seen up to 21 s
    # late. The same cap as the caches' relists.
    settings.networking.error_backoffs = (1, 1, 2, 3) + (RELIST_BACKOFF_CAP,) * 60
    State.queue = WorkQueue(int(os.environ.get("LONGCTX_WORKERS", "2")))
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    # How long a killed leader's peering record blocks the next replica (Kopf: 60 s).
    settings.peering.lifetime = int(os.environ.get("LONGCTX_PEERING_LIFETIME", "60"))
    State.kopf_context = None   # a restarted operator loop has a new one
    namespaces = tuple(n for n in os.environ.get("LONGCTX_NAMESPACES", "").split(",") if n)
    engine_load.metrics_networks()   # a bad value stops the start, naming it
    # The caches list and watch through a client of their own, which reads no cache; the
    # reconcile's client shares its connections and reads through the caches.
    lister = Kube.from_environment()
    State.caches = Caches(lister, namespaces, changed=_child_changed)
    State.kube = Kube(lister.api, caches=State.caches)
    State.caches.start()
    pods = State.caches.stores["Pod"]
    State.engine_watch = EngineWatch(lambda: pods.all() if pods.synced.is_set() else [],
                                     _fault_seen)
    State.engine_watch.start()
    if not State.caches.wait_synced(CACHE_SYNC_SECONDS):
        log.warning("watch caches not synced after %d s; reading from the API server until "
                    "they are", CACHE_SYNC_SECONDS)
    port = os.environ.get("LONGCTX_METRICS_PORT")
    if port:
        metrics.serve(int(port), os.environ.get("LONGCTX_METRICS_ADDRESS", "127.0.0.1"))


@kopf.on.cleanup()
def stop(**_: Any) -> None:
    State.retries.cancel_all()
    State.wakeups.cancel_all()
    if State.engine_watch is not None:
        State.engine_watch.stopping.set()
    if State.queue is not None:
        State.queue.stop()
    if State.caches is not None:
        State.caches.stop()


def reconcile_named(namespace: str, name: str, logger: logging.Logger) -> None:
    """Queues a reconcile of the CR, which reads it from the cache when it runs (and does
    nothing if it is gone)."""
    kube, queue = State.kube, State.queue
    assert kube is not None and queue is not None, "the startup handler did not run"

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

    queue.request((namespace, name), once)


def _export_phases() -> None:
    counts = Counter(State.phases.values())
    for phase in ("Pending", "Progressing", "Ready", "Degraded", "Refused"):
        metrics.CRS_BY_PHASE.labels(phase=phase).set(counts.get(phase, 0))
    rollouts = Counter(State.rollouts.values())
    for phase in rollout.PHASES:
        metrics.ROLLOUTS_BY_PHASE.labels(phase=phase).set(rollouts.get(phase, 0))


def _cache_event(type: str | None, body: kopf.Body) -> bool:
    """Puts the CR from Kopf's event into the CR cache, before the reconcile it asks for
    reads it (the cache's own watch may lag Kopf's); False when the event only echoes this
    operator's last write, which tells a reconcile nothing new."""
    kube = State.kube
    if kube is None:
        return True
    kind = body.get("kind", "")
    store = State.caches.stores.get(kind) if State.caches is not None else None
    if type == "DELETED":
        if store is not None:
            store.remove(dict(body))
        return True
    obj = dict(body)
    if store is not None:
        store.upsert(obj)
    return not kube.own_write(kind, obj)


# A coroutine: it only updates the cache and queues a reconcile, which runs on the work
# queue's threads; a sync handler would cost a hop through Kopf's executor.
@kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL)
async def deployment_event(type: str, body: kopf.Body, namespace: str, name: str,
                     logger: logging.Logger, **_: Any) -> None:
    if State.kopf_context is None:
        State.kopf_context = contextvars.copy_context()
    news = _cache_event(type, body)
    if type == "DELETED":
        State.phases.pop((namespace, name), None)
        State.rollouts.pop((namespace, name), None)
        _export_phases()
        return
    if news:
        reconcile_named(namespace, name, logger)


def _fault_seen(namespace: str, name: str) -> None:
    """The engine watch counted a data-path fault of this CR: reconcile it to report it."""
    if State.kopf_context is not None:
        State.kopf_context.copy().run(reconcile_named, namespace, name, log)


def _node_changed(name: str) -> None:
    """A node was cordoned or uncordoned: reconcile the CRs with engine pods on it, whose
    only pod of a role may have to move (controller/replacement.py). Its other changes
    (status heartbeats) reconcile nothing."""
    caches, context = State.caches, State.kopf_context
    if caches is None or context is None:
        return
    node = caches.nodes_store.get("", name)
    cordoned = bool(((node or {}).get("spec") or {}).get("unschedulable"))
    if cordoned == (name in State.cordoned):
        return
    (State.cordoned.add if cordoned else State.cordoned.discard)(name)
    for key in {(p["metadata"]["namespace"], p["metadata"]["labels"][contract.INSTANCE_LABEL])
                for p in caches.pods_on(name)
                if (p["metadata"].get("labels") or {}).get(contract.INSTANCE_LABEL)}:
        context.copy().run(reconcile_named, *key, log)


def _child_changed(kind: str, obj: dict[str, Any]) -> None:
    """A watch cache stored a change to a child (on the cache's thread): reconcile its CR,
    unless the change is this operator's own last write."""
    if kind == "Node":
        _node_changed(obj["metadata"]["name"])
        return
    kube, context = State.kube, State.kopf_context
    meta = obj["metadata"]
    cr_name = (meta.get("labels") or {}).get(contract.INSTANCE_LABEL)
    if kube is None or context is None or not cr_name or kube.own_write(kind, obj):
        return
    # In Kopf's context, which the reconcile's Events are posted through.
    context.copy().run(reconcile_named, meta["namespace"], cr_name, log)
