"""Watch caches of what a reconcile reads: one list-then-watch reflector per cached kind
(the CRs, their children and the engine pods), the Nodes, the CRDs, and the GPUs the pods
of every namespace request on each node (GpuUse).

A reconcile reads these stores instead of the API server, so it makes no GET or LIST of
its own. Each reflector lists the objects (of a child kind, those its `watch_labels`
select), then watches from that list's resourceVersion, and relists after an
expired watch (HTTP 410) or any error. A kind whose CRD is optional is listed once that
CRD is established. Until its first list is in, a kind is not `synced` and readers fall
back to the API. Objects are stored without `metadata.managedFields`, which the reconcile
never reads and which is most of their size, and are indexed by the CR they belong to.

The children's reflectors are also the operator's only watch of them: each change they
store asks for a reconcile of the CR (main.py), so an event and the cache it is read from
can never disagree.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import urllib3

from longctx_core import contract

from longctx_operator.controller.pods import requested_gpus
from longctx_operator.runtime.kube import Kube, KubeError, collection_path
from longctx_operator import kinds

log = logging.getLogger(__name__)
Key = tuple[str, str]   # (namespace, name)
WATCH_SECONDS = 240
# The longest wait between two attempts to list again after an error: the API server back
# from a restart is seen within this, and a kind the operator may not read costs one
# refused LIST per interval.
RELIST_BACKOFF_CAP = 5.0
TOMBSTONES = 10_000   # deletions remembered per kind, far more than one watch lags another


def _compact(obj: dict[str, Any], kind: kinds.Kind) -> str:
    """The stored form of an object of `kind`: compact JSON without
    `metadata.managedFields` (a fifth of the memory of the parsed object; a reconcile
    decodes the few it reads), with its apiVersion and kind set from the store's kind: a
    list's items carry neither, and a stored object must read as a watch event's does, or
    every field the operator sets, apiVersion first, would look drifted after a relist.
    The object passed in is not modified."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    if kind.kind == "CustomResourceDefinition":   # only whether it is established
        meta = {"name": meta["name"], "resourceVersion": meta.get("resourceVersion", "")}
        obj = {"status": {"conditions": [
            {"type": c.get("type"), "status": c.get("status")}
            for c in (obj.get("status") or {}).get("conditions") or []]}}
    return json.dumps({**obj, "apiVersion": kind.api_version, "kind": kind.kind,
                       "metadata": meta}, separators=(",", ":"))


def _essence(obj: dict[str, Any]) -> str:
    """What of an object is not its status nor the version and bookkeeping of its metadata
    (compact JSON)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items()
            if k not in ("managedFields", "resourceVersion")}
    return json.dumps({**obj, "metadata": meta, "status": None}, separators=(",", ":"),
                      sort_keys=True)


@dataclass(frozen=True)
class _Entry:
    labels: dict[str, str]
    version: str
    text: str
    essence: str = ""   # of a kind whose status no reconcile reads (kinds.Kind.status_read)

    @classmethod
    def of(cls, obj: dict[str, Any], kind: kinds.Kind) -> "_Entry":
        meta = obj["metadata"]
        return cls(dict(meta.get("labels") or {}), meta.get("resourceVersion", ""),
                   _compact(obj, kind), "" if kind.status_read else _essence(obj))

    def newer_than(self, current: "_Entry | None") -> bool:
        return current is None or _not_older(self.version, current.version)


def _stub(key: Key, entry: _Entry) -> dict[str, Any]:
    return {"metadata": {"namespace": key[0], "name": key[1], "labels": entry.labels,
                         "resourceVersion": entry.version}}


def _not_older(new: str, old: str) -> bool:
    """resourceVersions are etcd revisions here; compared numerically when they are."""
    return not (new.isdigit() and old.isdigit()) or int(new) >= int(old)


class Store:
    """The objects of one kind, by (namespace, name), from the reflectors of its scopes (all
    namespaces, or each watched namespace), and by the CR they belong to (its instance
    label), which every reconcile's selector names. Reads return fresh copies.

    Besides its reflector, a store is fed by this operator's own writes and, for the CRs, by
    Kopf's watch; one source may deliver an object's last update after another delivered
    its deletion. A deleted object's resourceVersion is kept as a tombstone, so that late
    update cannot bring it back (a ghost pod would keep a Recreate rollout waiting for
    ever); an object created again under the same name has a newer version and is stored."""

    def __init__(self, kind: kinds.Kind, scopes: tuple[str | None, ...]):
        self.kind = kind
        self._lock = threading.Lock()
        self._objects: dict[Key, _Entry] = {}
        self._by_instance: dict[Key, set[Key]] = {}
        self._tombstones: OrderedDict[Key, str] = OrderedDict()
        self._unlisted = set(scopes)
        self.synced = threading.Event()   # every scope listed at least once

    @staticmethod
    def _instance(key: Key, entry: _Entry) -> Key:
        return key[0], entry.labels.get(contract.INSTANCE_LABEL, "")

    def _put(self, key: Key, entry: _Entry) -> None:
        self._drop(key)
        self._objects[key] = entry
        self._by_instance.setdefault(self._instance(key, entry), set()).add(key)

    def _drop(self, key: Key) -> None:
        old = self._objects.pop(key, None)
        if old is not None:
            group = self._by_instance.get(self._instance(key, old), set())
            group.discard(key)
            if not group:
                self._by_instance.pop(self._instance(key, old), None)

    def _bury(self, key: Key, version: str) -> None:
        self._tombstones.pop(key, None)
        self._tombstones[key] = version
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _buried(self, key: Key, entry: _Entry) -> bool:
        version = self._tombstones.get(key, "")
        return entry.version.isdigit() and version.isdigit() and \
            int(entry.version) <= int(version)

    def replace(self, scope: str | None, items: Iterable[dict[str, Any]],
                version: str = "") -> list[dict[str, Any]]:
        """A list's items, at the list's resourceVersion: what it lacks was deleted by then.
        Returns every object added, changed or removed since the store last held this scope,
        as its metadata only."""
        fresh = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]):
                 _Entry.of(o, self.kind) for o in items}
        with self._lock:
            before = {k: e for k, e in self._objects.items() if scope is None or k[0] == scope}
            changed = [_stub(k, e) for k, e in fresh.items()
                       if k not in before or before[k].version != e.version]
            for key, old in before.items():
                if key not in fresh:
                    self._bury(key, version)
                    changed.append(_stub(key, old))
                self._drop(key)
            for key, entry in fresh.items():
                self._put(key, entry)
            self._unlisted.discard(scope)
            if not self._unlisted:
                self.synced.set()
        return changed

    def upsert(self, obj: dict[str, Any]) -> bool:
        """Stores the object unless the store has it at this version or newer (or it was
        deleted since); True when it stored a change a reconcile reads: not one of only a
        status no reconcile reads (kinds.Kind.status_read), which it stores all the same."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        with self._lock:
            current = self._objects.get(key)
        if current is not None and current.version == meta.get("resourceVersion"):
            return False   # the same version: this operator's own write, or the other watch
        entry = _Entry.of(obj, self.kind)
        with self._lock:
            current = self._objects.get(key)
            if not entry.newer_than(current) or self._buried(key, entry):
                return False
            self._tombstones.pop(key, None)
            self._put(key, entry)
        return not (current is not None and entry.essence
                    and entry.essence == current.essence)

    def remove(self, obj: dict[str, Any]) -> bool:
        """Forgets the object unless the store holds a newer one; True when it held it."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        with self._lock:
            current = self._objects.get(key)
            version = meta.get("resourceVersion", "")
            if current is not None and not _not_older(version, current.version):
                return False
            self._drop(key)
            self._bury(key, version)
            return current is not None

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._objects.get((namespace, name))
        return json.loads(entry.text) if entry is not None else None

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            texts = [e.text for e in self._objects.values()]
        return [json.loads(t) for t in texts]

    def labelled(self, key: str, values: Iterable[str]) -> list[dict[str, Any]]:
        """The objects whose label `key` has one of `values` (only those are decoded)."""
        wanted = set(values)
        with self._lock:
            texts = [e.text for e in self._objects.values() if e.labels.get(key) in wanted]
        return [json.loads(t) for t in texts]

    def select(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        with self._lock:
            instance = labels.get(contract.INSTANCE_LABEL)
            keys = self._by_instance.get((namespace, instance), set()) if instance is not None \
                else [k for k in self._objects if k[0] == namespace]
            found = [e for e in (self._objects[k] for k in keys)
                     if all(e.labels.get(k) == v for k, v in labels.items())]
        return [json.loads(e.text) for e in found]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)


Changed = Callable[[str, dict[str, Any]], None]   # (kind, the object or its metadata)


class GpuUse:
    """The GPUs the pods of every namespace request on each node: of each pod bound to a
    node, not finished and requesting GPUs, only its node and its GPUs (a pod's requests
    do not change). Fed by a Reflector like a Store; the GPU-shortage check of a blocked
    rollout reads it (controller/desire.py), so no reconcile lists the cluster's pods."""

    def __init__(self) -> None:
        self.kind = kinds.KIND_BY_NAME["Pod"]
        self._lock = threading.Lock()
        self._pods: dict[Key, tuple[str, int]] = {}
        self.synced = threading.Event()

    @staticmethod
    def _use(obj: dict[str, Any]) -> tuple[Key, tuple[str, int] | None]:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        node, gpus = spec.get("nodeName"), requested_gpus(spec)
        if not node or not gpus or status.get("phase") in ("Succeeded", "Failed"):
            return key, None
        return key, (node, gpus)

    def replace(self, scope: str | None, items: Iterable[dict[str, Any]],
                version: str = "") -> list[dict[str, Any]]:
        uses = {key: use for key, use in map(self._use, items) if use is not None}
        with self._lock:
            self._pods = uses
        self.synced.set()
        return []   # nothing is told of a change: a freed GPU reconciles no CR

    def upsert(self, obj: dict[str, Any]) -> bool:
        key, use = self._use(obj)
        with self._lock:
            if use is None:
                return self._pods.pop(key, None) is not None
            self._pods[key] = use
        return True

    def remove(self, obj: dict[str, Any]) -> bool:
        key, _ = self._use(obj)
        with self._lock:
            return self._pods.pop(key, None) is not None

    def by_node(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._lock:
            for node, gpus in self._pods.values():
                out[node] = out.get(node, 0) + gpus
        return out


class Reflector(threading.Thread):
    """Keeps one Store in step with the API server (daemon thread), and tells `changed` of
    every object that the store now holds at a new version or no longer holds: from the
    watch, and from a relist after the first (what changed while no watch ran)."""

    def __init__(self, kube: Kube, store: Store | GpuUse, namespace: str | None, selector: str,
                 ready: Callable[[], bool | None] = lambda: True, changed: Changed | None = None):
        super().__init__(daemon=True, name=f"reflector-{store.kind.plural}")
        self.kube, self.store, self.namespace = kube, store, namespace
        self.stopping = threading.Event()
        self.selector = selector
        self.ready = ready   # whether the kind can be listed yet (its CRD is established)
        self.changed = changed
        self._listed = False

    def run(self) -> None:
        backoff = 0.5
        while not self.stopping.is_set():
            if not self.ready():
                self.stopping.wait(1.0)
                continue
            try:
                version = self._list()
                backoff = 0.5
                while not self.stopping.is_set() and version is not None:
                    version = self._watch(version)
            except (KubeError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                log.info("watch of %s: %s; relisting in %.1f s", self.store.kind.plural, exc,
                         backoff)
            except Exception:   # an object this cache cannot read must not end the cache
                log.exception("watch of %s failed; relisting in %.1f s",
                              self.store.kind.plural, backoff)
            else:
                continue
            self.stopping.wait(backoff)
            backoff = min(backoff * 2, RELIST_BACKOFF_CAP)

    def _list(self) -> str:
        body = self.kube.list_raw(self.store.kind, self.namespace, self.selector)
        version = body["metadata"]["resourceVersion"]
        changed = self.store.replace(self.namespace, body.get("items") or [], version)
        if self._listed:   # the first list is the starting state, not a change
            for stub in changed:
                self._tell(stub)
        self._listed = True
        return version

    def _tell(self, obj: dict[str, Any]) -> None:
        if self.changed is not None:
            self.changed(self.store.kind.kind, obj)

    def _watch(self, version: str) -> str | None:
        """Applies events until the watch ends; returns the version to resume from, or None
        when the version expired and a relist is needed."""
        query = [("watch", "true"), ("resourceVersion", version),
                 ("allowWatchBookmarks", "true"), ("labelSelector", self.selector),
                 ("timeoutSeconds", str(WATCH_SECONDS))]
        path = collection_path(self.store.kind, self.namespace)
        with self.kube.stream(path, query, WATCH_SECONDS + 30) as response:
            for line in response:
                if self.stopping.is_set():
                    return None
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise ValueError(f"watch error: {obj.get('message')}")
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind in ("ADDED", "MODIFIED") and self.store.upsert(obj) or \
                        kind == "DELETED" and self.store.remove(obj):
                    self._tell(obj)
        return version


class Caches:
    """A Store and a Reflector for every cached kind, and one for the CRDs."""

    def __init__(self, kube: Kube, namespaces: tuple[str, ...] = (),
                 changed: Changed | None = None):
        """`changed` hears of every change to an object of a watched kind (kinds.Kind)
        and to a Node."""
        scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        # The CRDs the optional kinds need: asked for by every reconcile, so kept here.
        crd = kinds.KIND_BY_NAME["CustomResourceDefinition"]
        self.crds = Store(crd, (None,))
        # The nodes: read by the planner, and a cordon moves a role's only pod (a drain).
        self.nodes_store = Store(kinds.KIND_BY_NAME["Node"], (None,))
        self._reflectors = [Reflector(kube, self.crds, None, selector=""),
                            Reflector(kube, self.nodes_store, None, selector="", changed=changed)]
        # The GPUs in use on each node, for a blocked rollout's message: other workloads'
        # pods hold GPUs too. Only a cluster-wide install reads every namespace's pods.
        self.gpu_use = GpuUse()
        if not namespaces:
            self._reflectors.append(Reflector(kube, self.gpu_use, None, selector=""))
        self.stores = {k.kind: Store(k, scopes) for k in kinds.CACHED_KINDS}
        for k in kinds.CACHED_KINDS:
            ready = (lambda name=k.crd: self.crd_established(name)) if k.crd else lambda: True
            self._reflectors += [Reflector(kube, self.stores[k.kind], ns, k.label_selector,
                                           ready=ready, changed=changed if k.watched else None)
                                 for ns in scopes]

    def start(self) -> None:
        for r in self._reflectors:
            r.start()

    def stop(self) -> None:
        for r in self._reflectors:
            r.stopping.set()

    def wait_synced(self, timeout: float) -> bool:
        """Waits for the first list of every kind that can be listed now."""
        deadline = time.monotonic() + timeout
        if not self.crds.synced.wait(timeout):
            return False
        return all(s.synced.wait(max(deadline - time.monotonic(), 0))
                   for s in self.stores.values()
                   if not s.kind.crd or self.crd_established(s.kind.crd))

    def nodes(self) -> list[dict[str, Any]] | None:
        """Every Node, once listed (None before, or when the operator may not list them)."""
        return self.nodes_store.all() if self.nodes_store.synced.is_set() else None

    def gpus_in_use(self) -> dict[str, int] | None:
        """The GPUs requested on each node, once listed (None before, or in a namespaced
        install)."""
        return self.gpu_use.by_node() if self.gpu_use.synced.is_set() else None

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        """The engine pods the cache holds on `node`."""
        return [p for p in self.stores["Pod"].all()
                if (p.get("spec") or {}).get("nodeName") == node]

    def engine_pods(self) -> list[dict[str, Any]]:
        """The engine and endpoint pods (what the engine watch reads), once listed: not the
        routers' and pickers' pods, which it would decode for nothing at every look."""
        pods = self.stores["Pod"]
        return pods.labelled(contract.COMPONENT_LABEL,
                             (*contract.ROLES, contract.ENDPOINT_COMPONENT)) \
            if pods.synced.is_set() else []

    def crd_established(self, name: str) -> bool | None:
        """Whether a CRD is installed and established; None until the CRD list is in."""
        if not self.crds.synced.is_set():
            return None
        crd = self.crds.get("", name)
        return crd is not None and any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in crd["status"]["conditions"])

    def store(self, kind: str) -> Store | None:
        store = self.stores.get(kind)
        return store if store is not None and store.synced.is_set() else None
