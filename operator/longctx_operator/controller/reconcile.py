"""One level-based reconcile of a LongContextDeployment: read, plan, apply, report.

The function is synchronous and idempotent: it compares every desired child with the
live object and writes only what differs (a drifted field, a deleted child, a new spec),
then derives the status from the children and writes it only when it changed.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.sizing import placement
from longctx_core.sizing.host_memory import NodeMemory
from longctx_core.sizing.planner import plan as plan_capacity
from longctx_core.quantity import parse_bytes
from longctx_core.plan.roles import ServingPlan, serving_plan
from longctx_core.plan.rules import RecipeError
from longctx_core.sizing.scaling import scale_status
from longctx_core.api.schema import SpecError
from longctx_core.sizing.topology import topology_plan

from longctx_operator.controller import answers, data_path, drain, rollout
from longctx_operator.controller.builders import endpoint as endpoint_builder
from longctx_operator import metrics
from longctx_operator.controller.routers import Router, router_for
from longctx_operator.controller.desired import desired_objects
from longctx_operator.controller.drift import matches
from longctx_operator.controller.rendering import rendered
from longctx_operator.controller.replacement import (Replacement, RoleSwap, cordoned,
                                                     plan_for_revision, role_swap, swap_step)
from longctx_operator.controller.rollout import role_revision_of
from longctx_operator.controller.rollout_cost import (RolloutCost, prefix_tokens_per_pod,
                                                      rollout_cost)
from longctx_operator.controller.engine_documents import check_in_place_pair, check_pair, rerendered, rollout_cause
from longctx_operator.controller.cluster import Cluster, KubeError
from longctx_operator.controller.status import Observed, Refusal, compute_status, merge_patch, status_changed
from longctx_operator import kinds

log = logging.getLogger(__name__)
POD_MONITOR_CRD = kinds.KIND_BY_NAME["PodMonitor"].crd
RULE_CRD = kinds.KIND_BY_NAME["PrometheusRule"].crd
KEDA_CRD = kinds.KIND_BY_NAME["ScaledObject"].crd
# Added to the longest request's predicted time: the answer streamed after the prompt.
DRAIN_MARGIN_SECONDS = 60
# Without a prediction (an explicit architecture), the old revision drains this long.
DEFAULT_DRAIN_SECONDS = 600


@dataclass
class Outcome:
    """What one reconcile did, for events, metrics and tests."""

    phase: str = ""
    rollout_phase: str = ""
    wake_after: float | None = None    # seconds until a reconcile is due without an event
    applied: list[str] = field(default_factory=list)   # "Kind/name" written
    deleted: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    status_written: bool = False
    # Roles whose launch document this operator renders differently for an unchanged spec.
    rerendered: list[str] = field(default_factory=list)

    def wake_within(self, seconds: float) -> None:
        """Ask for a reconcile after at most `seconds`, with no event (the earliest wins)."""
        self.wake_after = seconds if self.wake_after is None else min(self.wake_after, seconds)


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _label(obj: dict[str, Any]) -> str:
    return "/".join(_key(obj))


def _node_memory(kube: Cluster) -> list[NodeMemory] | None:
    """The nodes' allocatable memory and labels for the planner; None when they cannot be
    listed."""
    nodes = kube.nodes()
    if nodes is None:
        return None
    return [n for n in map(NodeMemory.from_manifest, nodes) if n is not None]


def reconcile(kube: Cluster, cr: dict[str, Any]) -> Outcome:
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


def _reconcile(kube: Cluster, cr: dict[str, Any], outcome: Outcome) -> None:
    meta = cr["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    previous = cr.get("status") or {}
    refusal: Refusal | None = None
    plan_json: dict[str, Any] | None = None
    plan: ServingPlan | None = None
    spec: api.LongContextDeploymentSpec | None = None
    router: Router | None = None
    try:
        spec = api.load_spec(cr.get("spec"))
        router = router_for(spec)
        nodes = _node_memory(kube)
        capacity = plan_capacity(spec, nodes)
        plan_json = capacity.to_json()
        topology = topology_plan(spec, nodes)
        if topology is not None:
            plan_json["topology"] = topology.to_json()
        if not capacity.fits:
            refusal = Refusal("CapacityPlanned", capacity.reason, capacity.refusal or "")
        else:
            plan = rendered(cr, serving_plan(spec, name, capacity))
            check_pair(*(role.document for role in plan.roles))
    except (SpecError, RecipeError) as exc:
        refusal = Refusal("Accepted", "InvalidSpec", str(exc))

    revisions = _revisions(kube, name, namespace)
    step: rollout.Step | None = None
    serving: str | None = None
    replaced: Replacement | None = None
    swap: RoleSwap | None = None
    drained_nodes: set[str] = set()
    if refusal is None and plan is not None:
        serving = _serving_revision(kube, cr, router, previous)
        drained_nodes = cordoned(kube.nodes())
        plan, replaced = plan_for_revision(cr, plan, router, revisions.get(plan.revision),
                                           serving in (None, plan.revision), drained_nodes)
        cost = rollout_cost(cr, plan, router, revisions.get(serving or ""), replaced,
                            prefix_tokens_per_pod(previous.get("plan") or plan_json))
        if plan.revision in revisions:
            revisions[plan.revision] = revisions[plan.revision].focused(plan.role_revisions)
        try:
            check_in_place_pair(kube, cr, plan)
        except RecipeError as exc:
            refusal = Refusal("Accepted", "InvalidSpec", str(exc))
    if refusal is None and plan is not None:
        policy = _policy(plan)
        idle = drain.look(cr, revisions, plan.revision, serving, _utcnow())
        load = rollout.DrainLoad(idle, router_switched=bool(idle) and router.selects_only(
            kube, cr, plan.revision))
        step = rollout.step(desired=plan.revision, serving=serving,
                            revisions=revisions, previous=previous.get("rollout") or {},
                            policy=policy, now=_utcnow(), load=load,
                            capacity_shortage=lambda: _gpu_shortage(kube, plan, revisions),
                            cost=cost)
        if step.serving == plan.revision:
            swap = role_swap(plan, revisions.get(plan.revision))
        if swap is not None:
            step = _swap(kube, cr, plan, router, step, swap, policy, previous, idle, replaced,
                         revisions, cost)
        _apply_children(kube, cr, plan, router, step, policy, revisions, outcome, previous,
                        idle, drained_nodes, swap)
        outcome.events += step.events
        outcome.rollout_phase = step.phase
        if step.wake_after is not None:
            outcome.wake_within(step.wake_after)
        revisions = _revisions(kube, name, namespace)

    serving_rev = step.serving if step is not None else previous.get("revision")
    # Within the plan's revision, each role's own role revision (another revision has one).
    focus = dict(plan.role_revisions) if plan is not None and serving_rev == plan.revision \
        else {}
    if swap is not None and step is not None and not step.leave_pool and swap.leaving:
        # Until the swap's switch, the old role revision serves.
        focus.update({r: role_revision_of(s) for r, s in swap.old.statefulsets.items()})
    observed = _observe(kube, cr, router, revisions.get(serving_rev or ""), focus)
    if spec is None:
        desired_replicas = dict.fromkeys(contract.ROLES, 0)
    elif refusal:  # report the replicas that are actually running, not the refused spec's
        desired_replicas = {role: (observed.statefulsets.get(role) or {}).get("spec", {}).get(
            "replicas", 0) for role in contract.ROLES}
    else:
        desired_replicas = {role.role: role.replicas for role in plan.roles}
    _count_zero_capacity(name, namespace, observed, desired_replicas)
    data_path_condition = _data_path(cr, plan, revisions, outcome)
    status = compute_status(cr, refusal=refusal, plan=plan_json, observed=observed,
                            desired_replicas=desired_replicas,
                            endpoint=(endpoint_builder.url(name, namespace)
                                      if spec is not None and endpoint_builder.deployed(spec)
                                      else router.endpoint(name, namespace) if router else None),
                            previous=previous,
                            rollout=step, data_path=data_path_condition)
    status.update(scale_status(name, spec, observed.pods))
    answered, answer_events = answers.ANSWERS.take((namespace, name), previous.get("answers"))
    if answered is not None:
        status["answers"] = answered
    outcome.events += answer_events
    cause = rollout_cause(outcome.rerendered, bool(outcome.applied), cr, previous,
                          replaced.changed if replaced else ())
    if cause:
        status["rolloutCause"] = cause
    if step is None:   # a refused spec changes nothing about revisions
        status.update({k: previous[k] for k in ("rollout", "revision") if k in previous})
    outcome.phase = status["phase"]
    if status_changed(previous, status):
        kube.patch_status(contract.API_VERSION, contract.KIND, namespace, name,
                          merge_patch(previous, status))
        outcome.status_written = True
        _transition_events(previous, status, outcome)


def _data_path(cr: dict[str, Any], plan: ServingPlan | None,
               revisions: dict[str, rollout.Revision], outcome: Outcome) -> dict[str, str]:
    """The DataPathHealthy condition from the engines' restarts (every revision's pods)
    and the faults the engine watch counted; an Event for each fault not yet reported."""
    key = (cr["metadata"]["namespace"], cr["metadata"]["name"])
    now = _utcnow()
    policy = plan.decode.faults.kv_load_failure_policy if plan is not None else "fail"
    faults = data_path.restarted([p for r in revisions.values() for p in r.pods], now, policy)
    faults += data_path.RECORDED.faults(key, now, policy)
    outcome.events += [("Warning", f.reason, f.message)
                       for f in data_path.RECORDED.unreported(key, faults)]
    condition, clears_in = data_path.condition(faults, now)
    if clears_in is not None:
        outcome.wake_within(clears_in)
    return condition


def _swap(kube: Cluster, cr: dict[str, Any], plan: ServingPlan, router: Router,
          step: rollout.Step, swap: RoleSwap, policy: rollout.Policy,
          previous: dict[str, Any], idle: dict[str, float], replaced: Replacement | None,
          revisions: dict[str, rollout.Revision], cost: RolloutCost) -> rollout.Step:
    """The revision serves and a role's pods are replaced within it (replacement.py)."""
    leaving = [p["metadata"]["name"] for p in swap.old.pods if p not in swap.leaving]
    switched = bool(leaving) and router.leave_out(
        kube, cr, router.objects(cr, plan, plan.revision), leaving)
    return swap_step(swap, step, policy, previous.get("rollout") or {}, _utcnow(),
                     rollout.DrainLoad(idle, router_switched=switched),
                     lambda: _gpu_shortage(kube, plan, revisions), replaced, cost,
                     cr["metadata"]["name"])


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _policy(plan: ServingPlan) -> rollout.Policy:
    spec = plan.spec
    r = spec.rollout
    min_ready = {role.role: min(r.minReadyReplicas or role.replicas, role.replicas)
                 for role in plan.roles}
    if r.drainSeconds is not None:
        drain = float(r.drainSeconds)
    else:
        predicted = plan.prediction
        drain = float(math.ceil(predicted["ttftSeconds"]) + DRAIN_MARGIN_SECONDS
                      if predicted else DEFAULT_DRAIN_SECONDS)
    budget = spec.engine.engineReadyTimeoutSeconds
    return rollout.Policy(strategy=r.strategy, min_ready=min_ready, drain_seconds=drain,
                          ready_timeout_seconds=float(budget),
                          downtime=f"up to the model load, engine.engineReadyTimeoutSeconds "
                                   f"= {budget} s")


def _revisions(kube: Cluster, name: str, namespace: str) -> dict[str, rollout.Revision]:
    selector = contract.selector_labels(name)
    return rollout.group_revisions(kube.list("apps/v1", "StatefulSet", namespace, selector),
                                   kube.list("v1", "Pod", namespace, selector))


def _serving_revision(kube: Cluster, cr: dict[str, Any], router: Router,
                      previous: dict[str, Any]) -> Optional[str]:
    """The revision that serves: the one the router sends requests to (one write switches
    it, so it is the truth), else the one the status last recorded."""
    return router.serving_revision(kube, cr) or previous.get("revision")


def _gpu_shortage(kube: Cluster, plan: ServingPlan, revisions: dict[str, rollout.Revision]
                  ) -> Optional[str]:
    """How many GPUs the new revision still needs on the nodes its placement selects, and
    how many are free there (None when nodes or pods cannot be read)."""
    nodes = kube.nodes()
    try:
        pods = kube.list("v1", "Pod", None) if nodes is not None else None
    except KubeError:
        pods = None
    if nodes is None or pods is None:
        return None
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in pod["spec"].get("containers", []):
            gpus = ((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu")
            used[node] = used.get(node, 0) + (parse_bytes(gpus) if gpus else 0)
    free = sum(max(parse_bytes((n.get("status") or {}).get("allocatable", {}).get(
        "nvidia.com/gpu", "0")) - used.get(n["metadata"]["name"], 0), 0) for n in nodes
        if placement.selects(plan.spec.placement, n["metadata"].get("labels") or {}))
    new = revisions.get(plan.revision)
    placed = {role: sum(1 for p in new.role_pods(role) if (p.get("spec") or {}).get("nodeName"))
              for role in contract.ROLES} if new else dict.fromkeys(contract.ROLES, 0)
    need = sum(max(r.replicas - placed[r.role], 0) * r.layout.gpusPerPod for r in plan.roles)
    return (f"the new revision needs {need} more {plan.spec.placement.gpuProduct} GPUs on "
            f"nodes matching {placement.describe(plan.spec.placement)}; free: {free}")


_ZERO_SINCE: dict[tuple[str, str], float] = {}


def _count_zero_capacity(name: str, namespace: str, observed: Observed,
                         desired: dict[str, int]) -> None:
    """Seconds during which a role that should serve had no Ready pod, between reconciles."""
    key = (namespace, name)
    now = time.monotonic()
    zero = any(desired.get(role) and not ((observed.statefulsets.get(role) or {}).get(
        "status") or {}).get("readyReplicas") for role in contract.ROLES)
    last = _ZERO_SINCE.pop(key, None)
    if zero:
        if last is not None:
            metrics.ZERO_CAPACITY_SECONDS.inc(now - last)
        _ZERO_SINCE[key] = now


def _apply_children(kube: Cluster, cr: dict[str, Any], plan: ServingPlan, router: Router,
                    step: rollout.Step, policy: rollout.Policy,
                    revisions: dict[str, rollout.Revision], outcome: Outcome,
                    previous: dict[str, Any], idle: dict[str, float],
                    drained_nodes: set[str], swap: RoleSwap | None) -> None:
    meta = cr["metadata"]
    with_monitor = plan.spec.monitoring.podMonitor and kube.crd_exists(POD_MONITOR_CRD)
    desired = desired_objects(
        cr, plan, router, with_pod_monitor=with_monitor, serving=step.serving,
        with_revision=step.apply_desired,
        with_capacity_rules=with_monitor and kube.crd_exists(RULE_CRD),
        with_keda=plan.spec.autoscaling is not None and kube.crd_exists(KEDA_CRD))
    new_generation = previous.get("observedGeneration") != meta.get("generation")
    events, wake = drain.drain_scale_down(kube, cr, plan, router, policy.drain_seconds,
                                          revisions, desired, idle)
    outcome.events += events
    if wake is not None:
        outcome.wake_within(wake)
    if swap is not None:
        now = _utcnow()
        for pod in step.leave_pool:
            kube.patch_metadata("v1", "Pod", meta["namespace"], pod,
                                rollout.draining_marks(now, True))
        leaving = [p["metadata"]["name"] for p in swap.old.pods]
        if step.leave_pool or len(leaving) > len(swap.leaving):
            router.leave_out(kube, cr, desired, leaving)
    moved = router.move_off(kube, cr, desired, drained_nodes)
    if moved:
        events.append(("Normal", "RouterMoving", f"the router leaves drained node "
                       f"{', '.join(moved)}: its new pod starts elsewhere before the old one "
                       "stops"))
        outcome.events.append(events[-1])
    # A same-generation write while a rollout or a drain moves on is its next step, not drift.
    moving = bool(step.events or events) or step.phase != "Steady" or wake is not None
    written: dict[tuple[str, str], list[str]] = {}   # (reason, verb) -> objects
    waves: dict[int, list[dict[str, Any]]] = {}
    for obj in desired:
        live = kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], obj["metadata"]["name"])
        if live is not None and matches(obj, live):
            continue
        waves.setdefault(kinds.KIND_BY_NAME[obj["kind"]].wave, []).append(obj)
        label = _label(obj)
        if live is None:
            why = ("Created", "created") if new_generation else \
                ("Progressed", "created as the rollout moved on") if moving else \
                ("Recreated", "recreated (deleted)")
        elif not new_generation and rerendered(obj, live):
            why = ("OperatorRender", "rolled in place, one pod at a time: this operator "
                   "renders a different launch document for the same spec")
            outcome.rerendered.append(obj["metadata"]["labels"][contract.COMPONENT_LABEL])
        elif new_generation:
            why = ("RollingOut", "updated to the new spec")
        elif moving:
            why = ("Progressed", "updated as the rollout or drain moved on")
        else:
            why = ("Repaired", "restored (a managed field had drifted)")
        written.setdefault(why, []).append(label)
    for wave in sorted(waves):
        kube.apply_all(waves[wave])
        outcome.applied += [_label(o) for o in waves[wave]]
    # One Event per reason, not per object: a new CR's 14 children make one Created event.
    outcome.events += [("Normal", reason, f"{', '.join(labels)} {verb}")
                       for (reason, verb), labels in written.items()]
    wanted = {_key(o) for o in desired}
    # Revisions that run stay (a draining one too) unless this step removes them.
    kept = (set(revisions) | {plan.revision}) - set(step.delete)
    for kind in kinds.MANAGED_KINDS:
        if kind.crd and not kube.crd_exists(kind.crd):
            continue   # nothing of a kind whose CRD is absent can exist
        for live in kube.list(kind.api_version, kind.kind, meta["namespace"],
                              contract.selector_labels(meta["name"])):
            owners = live["metadata"].get("ownerReferences", [])
            revision = live["metadata"].get("labels", {}).get(contract.PAIRING_LABEL)
            retired = live["metadata"]["name"] in step.retire
            if (kind.kind, live["metadata"]["name"]) in wanted or (
                    revision in kept and not retired) or not any(
                    o.get("uid") == meta["uid"] for o in owners):
                continue
            kube.delete(kind.api_version, kind.kind, meta["namespace"], live["metadata"]["name"])
            outcome.deleted.append(f"{kind.kind}/{live['metadata']['name']}")
            outcome.events.append(("Normal", "Removed", f"{kind.kind}/{live['metadata']['name']}"
                                   " is no longer part of the spec"))
    for kind in {o["kind"] for o in desired}:
        metrics.MANAGED_OBJECTS.labels(kind=kind).set(sum(o["kind"] == kind for o in desired))


def _observe(kube: Cluster, cr: dict[str, Any], router: Router | None,
             serving: rollout.Revision | None, focus: dict[str, str | None]) -> Observed:
    """The serving revision's StatefulSets and pods (of each role's serving role revision,
    `focus`), and the router's readiness."""
    if serving is not None and focus:
        serving = serving.focused(focus)
    return Observed(statefulsets=dict(serving.statefulsets) if serving else {},
                    pods=[p for r in contract.ROLES for p in serving.role_pods(r)]
                    if serving else [],
                    router=router.status(kube, cr) if router is not None else None)


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
