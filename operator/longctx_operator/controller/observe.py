"""What one reconcile reads, read once before it decides anything: the Snapshot. Every
read comes from the watch caches (runtime/cache.py); the rest of the reconcile reads the
snapshot only, so what it desires is a function of the spec and this snapshot."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Optional

from longctx_core import contract

from longctx_operator import kinds
from longctx_operator.controller import rollout
from longctx_operator.controller.cluster import Cluster

Key = tuple[str, str]   # (kind, name)


@dataclass(frozen=True)
class Snapshot:
    """The cluster as one reconcile of `cr` sees it, at `now`."""

    cr: dict[str, Any]
    now: datetime.datetime
    nodes: Optional[list[dict[str, Any]]]        # None: the Nodes cannot be read
    gpus_in_use: Optional[dict[str, int]]        # GPUs pods request, by node; None: unknown
    children: dict[Key, dict[str, Any]]          # every live child of every managed kind
    pods: tuple[dict[str, Any], ...]             # every pod of the CR's workloads
    crds: frozenset[str]                         # the optional kinds' CRDs that exist

    def child(self, kind: str, name: str) -> Optional[dict[str, Any]]:
        return self.children.get((kind, name))

    def revisions(self) -> dict[str, rollout.Revision]:
        """The CR's revisions: its StatefulSets and the pods labelled with a pairing key."""
        sets = [o for (kind, _), o in self.children.items() if kind == "StatefulSet"]
        return rollout.group_revisions(sets, list(self.pods))

    def component_pods(self, component: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if _component(p) == component]

    @property
    def cordoned(self) -> set[str]:
        """The nodes being drained (unschedulable)."""
        return {n["metadata"]["name"] for n in self.nodes or []
                if (n.get("spec") or {}).get("unschedulable")}

    def after(self, written: list[dict[str, Any]], deleted: list[Key]) -> "Snapshot":
        """The same snapshot with the objects this reconcile wrote, as the API server
        answered, and without those it deleted: what the status reports, with no second
        read of the caches."""
        children = {k: o for k, o in self.children.items() if k not in set(deleted)}
        children.update({(o["kind"], o["metadata"]["name"]): o for o in written})
        return Snapshot(self.cr, self.now, self.nodes, self.gpus_in_use, children, self.pods,
                        self.crds)


def _component(obj: dict[str, Any]) -> Optional[str]:
    return (obj["metadata"].get("labels") or {}).get(contract.COMPONENT_LABEL)


def _controller(obj: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The owner reference that controls `obj`, if any."""
    return next((r for r in obj["metadata"].get("ownerReferences") or []
                 if r.get("controller")), None)


def _owned(obj: dict[str, Any], uid: Optional[str]) -> bool:
    """Whether `obj` is this CR's: a deleted CR of the same name leaves its children, which
    carry its name's labels, until the garbage collector removes them; they are not this
    CR's revisions (and not this reconcile's to delete)."""
    controller = _controller(obj)
    return controller is None or uid is None or controller.get("uid") == uid


def _owned_by_sets(pod: dict[str, Any], sets: set[Optional[str]]) -> bool:
    """Whether `pod` is one of these StatefulSets' or of another workload (the router's,
    the endpoint's), not of a StatefulSet `_owned` left out."""
    controller = _controller(pod)
    return controller is None or controller.get("kind") != "StatefulSet" or \
        controller.get("uid") in sets


def observe(kube: Cluster, cr: dict[str, Any], now: datetime.datetime) -> Snapshot:
    """Reads the snapshot of `cr` from the caches: its children of each managed kind (of a
    kind whose CRD exists), the pods of its workloads, the Nodes and the GPUs in use."""
    meta = cr["metadata"]
    namespace, selector = meta["namespace"], contract.selector_labels(meta["name"])
    crds = frozenset(k.crd for k in kinds.MANAGED_KINDS if k.crd and kube.crd_exists(k.crd))
    children = {(kind.kind, o["metadata"]["name"]): o
                for kind in kinds.MANAGED_KINDS if not kind.crd or kind.crd in crds
                for o in kube.list(kind.api_version, kind.kind, namespace, selector)
                if _owned(o, meta.get("uid"))}
    sets = {o["metadata"].get("uid") for (kind, _), o in children.items()
            if kind == "StatefulSet"}
    pods = tuple(p for p in kube.list("v1", "Pod", namespace, selector)
                 if _owned_by_sets(p, sets))
    return Snapshot(cr=cr, now=now, nodes=kube.nodes(), gpus_in_use=kube.gpus_in_use(),
                    children=children, pods=pods, crds=crds)
