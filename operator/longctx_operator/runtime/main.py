"""The operator process: Kopf's handlers and the Controller behind them. Every event of a
LongContextDeployment (from Kopf) or of one of its children (from the children's watch
caches, cache.py) asks the Controller's work queue for one level-based reconcile of that CR;
bursts of events are coalesced (work_queue.py).

No handler stores progress or adds finalizers: children are garbage-collected through
their ownerReferences, and the status is recomputed from the children each time.
"""

from __future__ import annotations

import contextvars
import gc
import logging
import os
from collections import Counter
from typing import Any

import kopf

from longctx_core import contract
from longctx_core.plan.rules import compile_rules

from longctx_operator.controller import engine_load, rollout
from longctx_operator.controller.memory import Memory
from longctx_operator import metrics
from longctx_operator.runtime.cache import RELIST_BACKOFF_CAP, Caches
from longctx_operator.runtime.engine_watch import EngineWatch
from longctx_operator.runtime.kube import Kube, KubeError
from longctx_operator.runtime.work_queue import DelayingQueue
from longctx_operator.controller.reconcile import reconcile

log = logging.getLogger(__name__)
Key = tuple[str, str]   # a CR's (namespace, name)
# How long the startup waits for the caches' first lists before serving events anyway
# (reads fall back to the API server until a kind is listed).
CACHE_SYNC_SECONDS = 30


class Controller:
    """The operator's state, in one object: the API client that reads through the watch
    caches, one delaying work queue of CR keys (events, wake-ups and retries alike), the
    engine watch and the memory it and the reconciles share (controller/memory.py), and
    what the phase metrics export. A reconcile's every failure is retried with back-off; a
    later event runs it sooner and a success resets the back-off. Kopf's handlers reach it
    through Kopf's `memo`."""

    def __init__(self, kube: Kube, caches: Caches, workers: int) -> None:
        self.kube, self.caches = kube, caches
        self.queue = DelayingQueue(workers, self._reconcile)
        self.memory = Memory()
        self.engine_watch: EngineWatch | None = None
        # The context of Kopf's event processing, which kopf.event() posts through (the
        # startup handler's lacks it): taken from the first CR event. A child change before
        # that one needs no reconcile of its own, since every CR's first event comes later.
        self.kopf_context: contextvars.Context | None = None
        self.phases: dict[Key, str] = {}
        self.rollouts: dict[Key, str] = {}
        self.cordoned: set[str] = set()   # the nodes last seen unschedulable

    def request(self, key: Key) -> None:
        """A reconcile of the CR now; it runs in Kopf's context, whatever thread asks."""
        if self.kopf_context is None:
            self.queue.add(key)
        else:
            self.kopf_context.copy().run(self.queue.add, key)

    def stop(self) -> None:
        if self.engine_watch is not None:
            self.engine_watch.stopping.set()
        self.queue.stop()
        self.caches.stop()

    def _reconcile(self, key: Key) -> None:
        namespace, name = key
        cr = self.kube.get(contract.API_VERSION, contract.KIND, namespace, name)
        if cr is None or cr["metadata"].get("deletionTimestamp"):
            self.gone(key)
            return
        try:
            outcome = reconcile(self.kube, cr, self.memory)
        except Exception as exc:
            delay = self.queue.retry(key)
            why = str(exc) if isinstance(exc, KubeError) else f"{type(exc).__name__}: {exc}"
            kopf.event(cr, type="Warning", reason="ReconcileFailed",
                       message=f"{why}; retrying in {delay:.0f} s")
            log.error("%s/%s: %s; retrying in %.0f s", namespace, name, why, delay,
                      exc_info=not isinstance(exc, KubeError))
            return
        self.queue.forget(key)
        if outcome.wake_after is not None:
            self.queue.add(key, outcome.wake_after)
        for type_, reason, message in outcome.events:
            kopf.event(cr, type=type_, reason=reason, message=message)
            log.info("%s/%s %s: %s", namespace, name, reason, message)
        self.phases[key] = outcome.phase
        if outcome.rollout_phase:
            self.rollouts[key] = outcome.rollout_phase
        self.export_phases()

    def gone(self, key: Key) -> None:
        self.phases.pop(key, None)
        self.rollouts.pop(key, None)
        self.queue.forget(key)
        self.memory.forget(key)
        self.export_phases()

    def export_phases(self) -> None:
        counts = Counter(self.phases.values())
        for phase in ("Pending", "Progressing", "Ready", "Degraded", "Refused"):
            metrics.CRS_BY_PHASE.labels(phase=phase).set(counts.get(phase, 0))
        rollouts = Counter(self.rollouts.values())
        for phase in rollout.PHASES:
            metrics.ROLLOUTS_BY_PHASE.labels(phase=phase).set(rollouts.get(phase, 0))

    def node_changed(self, name: str) -> None:
        """A node was cordoned or uncordoned: reconcile the CRs with engine pods on it, whose
        only pod of a role may have to move (controller/replacement.py). Its other changes
        (status heartbeats) reconcile nothing."""
        node = self.caches.nodes_store.get("", name)
        cordoned = bool(((node or {}).get("spec") or {}).get("unschedulable"))
        if cordoned == (name in self.cordoned):
            return
        (self.cordoned.add if cordoned else self.cordoned.discard)(name)
        for key in {(p["metadata"]["namespace"], p["metadata"]["labels"][contract.INSTANCE_LABEL])
                    for p in self.caches.pods_on(name)
                    if (p["metadata"].get("labels") or {}).get(contract.INSTANCE_LABEL)}:
            self.request(key)

    def child_changed(self, kind: str, obj: dict[str, Any]) -> None:
        """A watch cache stored a change to a child (on the cache's thread): reconcile its
        CR, unless the change is this operator's own last write."""
        if self.kopf_context is None:
            return
        if kind == "Node":
            self.node_changed(obj["metadata"]["name"])
            return
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if kind == "Pod" and contract.ROLE_LABEL not in labels:
            return   # a router's or the endpoint's pod: read when a reconcile runs
        cr_name = labels.get(contract.INSTANCE_LABEL)
        if cr_name and not self.kube.own_write(kind, obj):
            self.request((meta["namespace"], cr_name))

    def fault_seen(self, namespace: str, name: str) -> None:
        """The engine watch counted a data-path fault of this CR: reconcile it to report it."""
        if self.kopf_context is not None:
            self.request((namespace, name))



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


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.INFO
    settings.persistence.diffbase_storage = NoDiffBase()
    # Kopf logs "Handler '...' succeeded." for every watch event of a CR: nothing to say
    # and a measurable share of an event's cost. Its warnings and errors still show.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = int(os.environ.get("LONGCTX_WATCH_SERVER_TIMEOUT", "300"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.networking.request_timeout = 60
    # Kopf's watch of the CRs retries a refused request with delays growing to 21 s (and
    # starts over after the eighth): an API server back from a restart was seen up to 21 s
    # late. The same cap as the caches' relists.
    settings.networking.error_backoffs = (1, 1, 2, 3) + (RELIST_BACKOFF_CAP,) * 60
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    # How long a killed leader's peering record blocks the next replica (Kopf: 60 s).
    settings.peering.lifetime = int(os.environ.get("LONGCTX_PEERING_LIFETIME", "60"))
    namespaces = tuple(n for n in os.environ.get("LONGCTX_NAMESPACES", "").split(",") if n)
    engine_load.metrics_networks()   # a bad value stops the start, naming it
    compile_rules()   # before the first reconcile, which would wait for it
    # The caches list and watch through a client of their own, which reads no cache; the
    # reconcile's client shares its connections and reads through the caches.
    lister = Kube.from_environment()
    caches = Caches(lister, namespaces,
                    changed=lambda kind, obj: controller.child_changed(kind, obj))
    controller = Controller(Kube(lister.api, caches=caches), caches,
                            int(os.environ.get("LONGCTX_WORKERS", "2")))
    memo.controller = controller
    caches.start()
    controller.engine_watch = EngineWatch(caches.engine_pods, controller.fault_seen,
                                          controller.memory)
    controller.engine_watch.start()
    if not caches.wait_synced(CACHE_SYNC_SECONDS):
        log.warning("watch caches not synced after %d s; reading from the API server until "
                    "they are", CACHE_SYNC_SECONDS)
    port = os.environ.get("LONGCTX_METRICS_PORT")
    if port:
        metrics.serve(int(port), os.environ.get("LONGCTX_METRICS_ADDRESS", "127.0.0.1"))
    # What the start made (modules, the API's types, the compiled rules) lives as long as
    # the process: out of the collector's way, so that its full collections, which a burst
    # of events triggers, do not walk it each time.
    gc.freeze()
    # A burst of events allocates many short-lived objects: with Python's default
    # threshold (700) the collector ran so often that it was about a tenth of the
    # operator's CPU at 100 CRs (benchmarks/operator_scale.py); most of them are freed
    # before a collection at 20,000.
    gc.set_threshold(20_000, 50, 100)


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    controller = getattr(memo, "controller", None)
    if controller is not None:
        controller.stop()


def _cache_event(controller: Controller, type: str | None, body: kopf.Body) -> bool:
    """Puts the CR from Kopf's event into the CR cache, before the reconcile it asks for
    reads it (the cache's own watch may lag Kopf's); False when the event only echoes this
    operator's last write, which tells a reconcile nothing new."""
    kind = body.get("kind", "")
    store = controller.caches.stores.get(kind)
    if type == "DELETED":
        if store is not None:
            store.remove(dict(body))
        return True
    obj = dict(body)
    if store is not None:
        store.upsert(obj)
    return not controller.kube.own_write(kind, obj)


# A coroutine: it only updates the cache and queues a reconcile, which runs on the work
# queue's threads; a sync handler would cost a hop through Kopf's executor.
@kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL)
async def deployment_event(type: str, body: kopf.Body, namespace: str, name: str,
                           memo: kopf.Memo, **_: Any) -> None:
    controller: Controller = memo.controller
    if controller.kopf_context is None:
        controller.kopf_context = contextvars.copy_context()
    news = _cache_event(controller, type, body)
    if type == "DELETED":
        controller.gone((namespace, name))
        return
    if news:
        controller.request((namespace, name))
