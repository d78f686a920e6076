"""What one reconcile writes (its only API calls): the desired objects that differ from the
snapshot's live ones, in waves; the pods' pool marks; the children no longer desired. One
Event per reason, not per object: a new CR's 14 children make one Created event."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longctx_core import contract

from longctx_operator import kinds, metrics
from longctx_operator.controller import rollout
from longctx_operator.controller.cluster import Cluster
from longctx_operator.controller.desire import Desired
from longctx_operator.controller.drift import matches
from longctx_operator.controller.engine_documents import rerendered
from longctx_operator.controller.observe import Key, Snapshot


@dataclass
class Acts:
    """What the writes were: the objects as the API server answered, and for the events."""

    written: list[dict[str, Any]] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)     # "Kind/name"
    deleted: list[Key] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    # Roles whose launch document this operator renders differently for an unchanged spec.
    rerendered: list[str] = field(default_factory=list)


def _label(key: Key) -> str:
    return "/".join(key)


def act(kube: Cluster, snapshot: Snapshot, desired: Desired) -> Acts:
    cr = snapshot.cr
    meta = cr["metadata"]
    namespace = meta["namespace"]
    new_generation = (cr.get("status") or {}).get("observedGeneration") != meta.get("generation")
    out = Acts()
    for pod, leave in desired.marks:
        kube.patch_metadata("v1", "Pod", namespace, pod, rollout.draining_marks(snapshot.now,
                                                                                leave))
    written: dict[tuple[str, str], list[str]] = {}   # (reason, verb) -> objects
    waves: dict[int, list[dict[str, Any]]] = {}
    for obj in desired.objects:
        key = (obj["kind"], obj["metadata"]["name"])
        live = snapshot.child(*key)
        if live is not None and matches(obj, live):
            continue
        waves.setdefault(kinds.KIND_BY_NAME[obj["kind"]].wave, []).append(obj)
        if live is None:
            why = ("Created", "created") if new_generation else \
                ("Progressed", "created as the rollout moved on") if desired.moving else \
                ("Recreated", "recreated (deleted)")
        elif not new_generation and rerendered(obj, live):
            why = ("OperatorRender", "rolled in place, one pod at a time: this operator "
                   "renders a different launch document for the same spec")
            out.rerendered.append(obj["metadata"]["labels"][contract.COMPONENT_LABEL])
        elif new_generation:
            why = ("RollingOut", "updated to the new spec")
        elif desired.moving:
            why = ("Progressed", "updated as the rollout or drain moved on")
        else:
            why = ("Repaired", "restored (a managed field had drifted)")
        written.setdefault(why, []).append(_label(key))
    for wave in sorted(waves):
        out.written += kube.apply_all(waves[wave])
        out.applied += [_label((o["kind"], o["metadata"]["name"])) for o in waves[wave]]
    out.events += [("Normal", reason, f"{', '.join(labels)} {verb}")
                   for (reason, verb), labels in written.items()]
    for kind, name in desired.delete:
        kube.delete(kinds.KIND_BY_NAME[kind].api_version, kind, namespace, name)
        out.deleted.append((kind, name))
        out.events.append(("Normal", "Removed", f"{kind}/{name} is no longer part of the spec"))
    for kind in {o["kind"] for o in desired.objects}:
        metrics.MANAGED_OBJECTS.labels(kind=kind).set(sum(o["kind"] == kind
                                                          for o in desired.objects))
    return out
