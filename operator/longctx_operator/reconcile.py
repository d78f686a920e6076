"""One level-based reconcile of a LongContextDeployment: read, plan, apply, report.

The function is synchronous and idempotent: it compares every desired child with the
live object and writes only what differs (a drifted field, a deleted child, a new spec),
then derives the status from the children and writes it only when it changed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from longctx_engine import api, contract
from longctx_engine.compat import pd_compatibility
from longctx_engine.identity import PodIdentity
from longctx_engine.planner import NodeMemory, plan as plan_capacity
from longctx_engine.roles import RolePlan, ServingPlan, serving_plan
from longctx_engine.rules import RecipeError
from longctx_engine.layout import role_layout
from longctx_engine.scaling import scale_status
from longctx_engine.schema import SpecError
from longctx_engine.topology import topology_plan

from . import metrics
from .builders.router import picker_status
from .desired import desired_objects
from .kube import Kube
from .status import Observed, Refusal, compute_status, status_changed

log = logging.getLogger(__name__)
POD_MONITOR_CRD = contract.KIND_BY_NAME["PodMonitor"].crd
RULE_CRD = contract.KIND_BY_NAME["PrometheusRule"].crd
KEDA_CRD = contract.KIND_BY_NAME["ScaledObject"].crd


@dataclass
class Outcome:
    """What one reconcile did, for events, metrics and tests."""

    phase: str = ""
    applied: list[str] = field(default_factory=list)   # "Kind/name" written
    deleted: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    status_written: bool = False


def matches(desired: Any, live: Any) -> bool:
    """Whether every field the operator sets has that value in the live object."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(matches(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(desired) == len(live)
                and all(matches(d, l) for d, l in zip(desired, live)))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired == live
    if isinstance(desired, (int, float)) and isinstance(live, str):
        return str(desired) == live
    return desired == live


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def check_pair(prefill: RolePlan, decode: RolePlan, cr_name: str, namespace: str) -> None:
    """Refuses to pair a prefill and a decode whose engines could not complete a NIXL
    handshake. The two plans may come from different specs: the role being rolled and the
    other role still running the previous one."""
    commands = [plan.command(PodIdentity.first(cr_name, namespace, plan.role))
                for plan in (prefill, decode)]
    mismatches = pd_compatibility(*commands)
    if mismatches:
        raise RecipeError("prefill and decode engines are incompatible for NIXL: "
                          + "; ".join(mismatches))


def _node_memory(kube: Kube, fresh: bool = False) -> list[NodeMemory] | None:
    """The nodes' allocatable memory and labels for the planner; None when they cannot be
    listed. `fresh`: listed now (a topology domain is judged by labels just applied)."""
    nodes = kube.nodes(max_age=0) if fresh else kube.nodes()
    if nodes is None:
        return None
    return [n for n in map(NodeMemory.from_manifest, nodes) if n is not None]


def reconcile(kube: Kube, cr: dict[str, Any]) -> Outcome:
    started = time.monotonic()
    outcome = Outcome()
    try:
        _reconcile(kube, cr, outcome)
        metrics.RECONCILES.labels(result="refused" if outcome.phase == "Refused" else "ok").inc()
        return outcome
    except Exception:
        metrics.RECONCILES.labels(result="error").inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


def _reconcile(kube: Kube, cr: dict[str, Any], outcome: Outcome) -> None:
    meta = cr["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    previous = cr.get("status") or {}
    refusal: Refusal | None = None
    plan_json: dict[str, Any] | None = None
    plan: ServingPlan | None = None
    spec: api.LongContextDeploymentSpec | None = None
    try:
        spec = api.load_spec(cr.get("spec"))
        nodes = _node_memory(kube, fresh=spec.placement.topologyKey is not None)
        capacity = plan_capacity(spec, nodes)
        plan_json = capacity.to_json()
        topology = topology_plan(spec, nodes)
        if topology is not None:
            plan_json["topology"] = topology.to_json()
        if not capacity.fits:
            refusal = Refusal("CapacityPlanned", capacity.reason, capacity.refusal or "")
        else:
            plan = serving_plan(spec, name)
            check_pair(plan.prefill, plan.decode, name, namespace)
    except (SpecError, RecipeError) as exc:
        refusal = Refusal("Accepted", "InvalidSpec", str(exc))

    if refusal is None and plan is not None:
        _apply_children(kube, cr, plan, outcome, previous)

    observed = _observe(kube, name, namespace, spec)
    if spec is None:
        desired_replicas = dict.fromkeys(contract.ROLES, 0)
    elif refusal:  # report the replicas that are actually running, not the refused spec's
        desired_replicas = {role: (observed.statefulsets.get(role) or {}).get("spec", {}).get(
            "replicas", 0) for role in contract.ROLES}
    else:
        desired_replicas = {role: role_layout(spec, role).replicas for role in contract.ROLES}
    status = compute_status(cr, refusal=refusal, plan=plan_json, observed=observed,
                            desired_replicas=desired_replicas,
                            endpoint=_endpoint(name, namespace, spec), previous=previous)
    status.update(scale_status(name, spec, observed.pods))
    outcome.phase = status["phase"]
    if status_changed(previous, status):
        kube.patch_status(contract.API_VERSION, contract.KIND, namespace, name, status)
        outcome.status_written = True
        _transition_events(previous, status, outcome)


def _apply_children(kube: Kube, cr: dict[str, Any], plan: ServingPlan, outcome: Outcome,
                    previous: dict[str, Any]) -> None:
    meta = cr["metadata"]
    with_monitor = plan.spec.monitoring.podMonitor and kube.crd_exists(POD_MONITOR_CRD)
    desired = desired_objects(
        cr, plan, with_pod_monitor=with_monitor,
        with_capacity_rules=with_monitor and kube.crd_exists(RULE_CRD),
        with_keda=plan.spec.autoscaling is not None and kube.crd_exists(KEDA_CRD))
    new_generation = previous.get("observedGeneration") != meta.get("generation")
    for obj in desired:
        live = kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], obj["metadata"]["name"])
        if live is not None and matches(obj, live):
            continue
        kube.apply(obj)
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        outcome.applied.append(label)
        if live is None:
            reason, verb = ("Created", "created") if new_generation else ("Recreated",
                                                                          "recreated (it was deleted)")
        else:
            reason, verb = ("RollingOut", "updated to the new spec") if new_generation else (
                "Repaired", "restored (a managed field had drifted)")
        outcome.events.append(("Normal", reason, f"{label} {verb}"))
    wanted = {_key(o) for o in desired}
    for kind in contract.MANAGED_KINDS:
        if kind.crd and not kube.crd_exists(kind.crd):
            continue   # nothing of a kind whose CRD is absent can exist
        for live in kube.list(kind.api_version, kind.kind, meta["namespace"],
                              contract.selector_labels(meta["name"])):
            owners = live["metadata"].get("ownerReferences", [])
            if (kind.kind, live["metadata"]["name"]) in wanted or not any(
                    o.get("uid") == meta["uid"] for o in owners):
                continue
            kube.delete(kind.api_version, kind.kind, meta["namespace"], live["metadata"]["name"])
            outcome.deleted.append(f"{kind.kind}/{live['metadata']['name']}")
            outcome.events.append(("Normal", "Removed", f"{kind.kind}/{live['metadata']['name']}"
                                   " is no longer part of the spec"))
    for kind in {o["kind"] for o in desired}:
        metrics.MANAGED_OBJECTS.labels(kind=kind).set(sum(o["kind"] == kind for o in desired))


def _observe(kube: Kube, name: str, namespace: str,
             spec: api.LongContextDeploymentSpec | None) -> Observed:
    statefulsets = {role: kube.get("apps/v1", "StatefulSet", namespace,
                                   contract.statefulset(name, role)) for role in contract.ROLES}
    pods = kube.list("v1", "Pod", namespace, contract.selector_labels(name))
    router = None
    if spec is not None and spec.router.enabled:
        router = picker_status(kube.get("apps/v1", "Deployment", namespace,
                                        contract.picker(name)))
    return Observed(statefulsets=statefulsets, pods=pods, router=router)


def _endpoint(name: str, namespace: str, spec: api.LongContextDeploymentSpec | None) -> str | None:
    if spec is None:
        return None
    if spec.router.enabled and spec.router.gateway:
        gw = spec.router.gateway
        return f"gateway {gw.namespace or namespace}/{gw.name} (HTTPRoute {namespace}/{name})"
    if spec.router.enabled:
        return f"inferencepool {namespace}/{contract.inference_pool(name)}"
    return f"{contract.headless_service(name, 'decode')}.{namespace}.svc"


def _transition_events(previous: dict[str, Any], status: dict[str, Any],
                       outcome: Outcome) -> None:
    before = {c["type"]: c for c in previous.get("conditions", [])}
    for cond in status["conditions"]:
        old = before.get(cond["type"])
        if old and old.get("status") == cond["status"] and old.get("reason") == cond["reason"]:
            continue
        if cond["type"] in ("CapacityPlanned", "Accepted") and cond["status"] == "False":
            outcome.events.append(("Warning", "SpecRefused", cond["message"]))
        elif cond["type"] == "Degraded" and cond["status"] == "True":
            outcome.events.append(("Warning", "Degraded", cond["message"]))
        elif cond["type"] == "Ready" and cond["status"] == "True":
            outcome.events.append(("Normal", "Ready", cond["message"]))
