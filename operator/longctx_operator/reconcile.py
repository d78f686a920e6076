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

from longctx_engine import api
from longctx_engine.compat import pd_compatibility
from longctx_engine.planner import plan as plan_capacity
from longctx_engine.recipes import PodIdentity, RecipeError, build_command
from longctx_engine.schema import SpecError

from . import metrics, naming
from .builders.router import picker_status
from .desired import MANAGED_KINDS, desired_objects
from .kube import Kube
from .status import Observed, Refusal, compute_status, status_changed

log = logging.getLogger(__name__)
API_VERSION = f"{api.GROUP}/{api.VERSION}"
POD_MONITOR_CRD = "podmonitors.monitoring.coreos.com"


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


def check_pair(spec: api.LongContextDeploymentSpec, cr_name: str, namespace: str) -> None:
    """Refuses specs whose prefill and decode engines could not complete a NIXL handshake."""
    commands = {role: build_command(spec, role, PodIdentity(
        cr_name=cr_name, namespace=namespace, pod_name=f"{naming.statefulset(cr_name, role)}-0",
        ordinal=0, pod_ip="0.0.0.0")) for role in naming.ROLES}
    mismatches = pd_compatibility(commands["prefill"], commands["decode"])
    if mismatches:
        raise RecipeError("prefill and decode engines are incompatible for NIXL: "
                          + "; ".join(mismatches))


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
    spec: api.LongContextDeploymentSpec | None = None
    try:
        spec = api.load_spec(cr.get("spec"))
        capacity = plan_capacity(spec)
        plan_json = capacity.to_json()
        if not capacity.fits:
            refusal = Refusal("CapacityPlanned", "InsufficientKVCapacity", capacity.refusal or "")
        else:
            check_pair(spec, name, namespace)
    except (SpecError, RecipeError) as exc:
        refusal = Refusal("Accepted", "InvalidSpec", str(exc))

    if refusal is None and spec is not None:
        _apply_children(kube, cr, spec, outcome, previous)

    observed = _observe(kube, name, namespace, spec)
    if spec is None:
        desired_replicas = dict.fromkeys(naming.ROLES, 0)
    elif refusal:  # report the replicas that are actually running, not the refused spec's
        desired_replicas = {role: (observed.statefulsets.get(role) or {}).get("spec", {}).get(
            "replicas", 0) for role in naming.ROLES}
    else:
        desired_replicas = {role: getattr(spec, role).replicas for role in naming.ROLES}
    status = compute_status(cr, refusal=refusal, plan=plan_json, observed=observed,
                            desired_replicas=desired_replicas,
                            endpoint=_endpoint(name, namespace, spec), previous=previous)
    outcome.phase = status["phase"]
    if status_changed(previous, status):
        kube.patch_status(API_VERSION, api.KIND, namespace, name, status)
        outcome.status_written = True
        _transition_events(previous, status, outcome)


def _apply_children(kube: Kube, cr: dict[str, Any], spec: api.LongContextDeploymentSpec,
                    outcome: Outcome, previous: dict[str, Any]) -> None:
    meta = cr["metadata"]
    with_monitor = spec.monitoring.podMonitor and kube.crd_exists(POD_MONITOR_CRD)
    desired = desired_objects(cr, spec, with_pod_monitor=with_monitor)
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
    for api_version, kind in MANAGED_KINDS:
        for live in kube.list(api_version, kind, meta["namespace"],
                              naming.selector_labels(meta["name"])):
            owners = live["metadata"].get("ownerReferences", [])
            if (kind, live["metadata"]["name"]) in wanted or not any(
                    o.get("uid") == meta["uid"] for o in owners):
                continue
            kube.delete(api_version, kind, meta["namespace"], live["metadata"]["name"])
            outcome.deleted.append(f"{kind}/{live['metadata']['name']}")
            outcome.events.append(("Normal", "Removed", f"{kind}/{live['metadata']['name']} is "
                                   "no longer part of the spec"))
    for kind in {o["kind"] for o in desired}:
        metrics.MANAGED_OBJECTS.labels(kind=kind).set(sum(o["kind"] == kind for o in desired))


def _observe(kube: Kube, name: str, namespace: str,
             spec: api.LongContextDeploymentSpec | None) -> Observed:
    statefulsets = {role: kube.get("apps/v1", "StatefulSet", namespace,
                                   naming.statefulset(name, role)) for role in naming.ROLES}
    pods = kube.list("v1", "Pod", namespace, naming.selector_labels(name))
    router = None
    if spec is not None and spec.router.enabled:
        router = picker_status(kube.get("apps/v1", "Deployment", namespace, naming.picker(name)))
    return Observed(statefulsets=statefulsets, pods=pods, router=router)


def _endpoint(name: str, namespace: str, spec: api.LongContextDeploymentSpec | None) -> str | None:
    if spec is None:
        return None
    if spec.router.enabled and spec.router.gateway:
        gw = spec.router.gateway
        return f"gateway {gw.namespace or namespace}/{gw.name} (HTTPRoute {namespace}/{name})"
    if spec.router.enabled:
        return f"inferencepool {namespace}/{naming.inference_pool(name)}"
    return f"{naming.headless_service(name, 'decode')}.{namespace}.svc"


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
