"""What one reconcile wants (pure): the spec's plan, the rollout's step, and the desired
objects, as functions of the CR, one snapshot (observe.py) and the draining pods' idle
times (memory.py). The router and the drains contribute to the desired objects as inputs
to their builders (`RouterEdits`, a scale-down's replicas); nothing edits an object after
it is built, and equal inputs give equal objects."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.api.schema import SpecError
from longctx_core.plan.roles import ServingPlan, serving_plan
from longctx_core.plan.rules import RecipeError
from longctx_core.quantity import parse_bytes
from longctx_core.sizing import placement
from longctx_core.sizing.host_memory import NodeMemory
from longctx_core.sizing.planner import plan as plan_capacity
from longctx_core.sizing.topology import topology_plan

from longctx_operator import kinds
from longctx_operator.controller import drain, rollout
from longctx_operator.controller.desired import desired_objects
from longctx_operator.controller.engine_documents import check_in_place_pair, check_pair
from longctx_operator.controller.observe import Key, Snapshot
from longctx_operator.controller.rendering import rendered
from longctx_operator.controller.replacement import (Replacement, RoleSwap, plan_for_revision,
                                                     role_swap, swap_step)
from longctx_operator.controller.rollout_cost import (RolloutCost, prefix_tokens_per_pod,
                                                      rollout_cost)
from longctx_operator.controller.routers import Router, RouterEdits, router_for
from longctx_operator.controller.status import Refusal

POD_MONITOR_CRD = kinds.KIND_BY_NAME["PodMonitor"].crd
RULE_CRD = kinds.KIND_BY_NAME["PrometheusRule"].crd
KEDA_CRD = kinds.KIND_BY_NAME["ScaledObject"].crd
# Added to the longest request's predicted time: the answer streamed after the prompt.
DRAIN_MARGIN_SECONDS = 60
# Without a prediction (an explicit architecture), the old revision drains this long.
DEFAULT_DRAIN_SECONDS = 600


@dataclass(frozen=True)
class Intent:
    """The spec's side of a reconcile: its plan for the revision it runs, or why it is
    refused (`refusal`; then nothing rolls out)."""

    spec: Optional[api.LongContextDeploymentSpec]
    router: Optional[Router]
    plan: Optional[ServingPlan]
    plan_json: Optional[dict[str, Any]]
    refusal: Optional[Refusal]
    revisions: dict[str, rollout.Revision]   # the plan's revision focused on its roles'
    serving: Optional[str] = None            # the revision the router sends requests to
    replaced: Optional[Replacement] = None
    cost: Optional[RolloutCost] = None

    @property
    def accepted(self) -> bool:
        return self.refusal is None and self.plan is not None


@dataclass(frozen=True)
class SpecPlan:
    """What the spec and the nodes' memory alone decide: the loaded spec, its router, the
    capacity plan (`plan_json`) and the serving plan with its launch documents, or why
    the spec is refused."""

    spec: Optional[api.LongContextDeploymentSpec]
    router: Optional[Router]
    plan: Optional[ServingPlan]
    plan_json: Optional[dict[str, Any]]
    refusal: Optional[Refusal]


def plan_spec(cr: dict[str, Any], nodes: Optional[list[NodeMemory]]) -> SpecPlan:
    """Loads the CR's spec and plans it on `nodes` (None: not known)."""
    spec = router = plan_json = None
    try:
        spec = api.load_spec(cr.get("spec"))
        router = router_for(spec)
        capacity = plan_capacity(spec, nodes)
        plan_json = capacity.to_json()
        topology = topology_plan(spec, nodes)
        if topology is not None:
            plan_json["topology"] = topology.to_json()
        if not capacity.fits:
            return SpecPlan(spec, router, None, plan_json, Refusal(
                "CapacityPlanned", capacity.reason, capacity.refusal or ""))
        plan = rendered(cr, serving_plan(spec, cr["metadata"]["name"], capacity))
        check_pair(*(role.document for role in plan.roles))
    except (SpecError, RecipeError) as exc:
        return SpecPlan(spec, router, None, plan_json,
                        Refusal("Accepted", "InvalidSpec", str(exc)))
    return SpecPlan(spec, router, plan, plan_json, None)


class SpecPlans:
    """Each CR's last SpecPlan with its inputs (its name, namespace and spec, the nodes'
    memory): most reconciles follow a child's status change, not an edit, and planning
    was most of such a reconcile's CPU. Equal inputs give an equal plan, so the last one
    is reused."""

    def __init__(self) -> None:
        self._last: dict[Key, tuple[Any, SpecPlan]] = {}

    def of(self, cr: dict[str, Any], nodes: Optional[list[NodeMemory]]) -> SpecPlan:
        meta = cr["metadata"]
        key = (meta["namespace"], meta["name"])
        inputs = (cr.get("spec"), nodes)
        last = self._last.get(key)
        if last is not None and last[0] == inputs:
            return last[1]
        planned = plan_spec(cr, nodes)
        self._last[key] = (copy.deepcopy(inputs), planned)
        return planned

    def forget(self, key: Key) -> None:
        self._last.pop(key, None)


def intend(snapshot: Snapshot, plans: SpecPlans) -> Intent:
    """Plans the spec against the snapshot's nodes (through `plans`) and its children."""
    cr = snapshot.cr
    previous = cr.get("status") or {}
    revisions = snapshot.revisions()
    nodes = None if snapshot.nodes is None else [
        n for n in map(NodeMemory.from_manifest, snapshot.nodes) if n is not None]
    planned = plans.of(cr, nodes)
    spec, router, plan, plan_json = planned.spec, planned.router, planned.plan, \
        planned.plan_json
    if plan is None or planned.refusal is not None:
        return Intent(spec, router, None, plan_json, planned.refusal, revisions)
    # The revision that serves: the one the router sends requests to (one write switches
    # it, so it is the truth), else the one the status last recorded.
    serving = router.serving_revision(snapshot) or previous.get("revision")
    plan, replaced = plan_for_revision(cr, plan, router, revisions.get(plan.revision),
                                       serving in (None, plan.revision), snapshot.cordoned)
    cost = rollout_cost(cr, plan, router, revisions.get(serving or ""), replaced,
                        prefix_tokens_per_pod(previous.get("plan") or plan_json))
    if plan.revision in revisions:
        revisions = {**revisions,
                     plan.revision: revisions[plan.revision].focused(plan.role_revisions)}
    refusal = None
    try:
        check_in_place_pair(cr, plan, snapshot.child(
            "ConfigMap", contract.engine_configmap(cr["metadata"]["name"], plan.revision)))
    except RecipeError as exc:
        refusal = Refusal("Accepted", "InvalidSpec", str(exc))
    return Intent(spec, router, plan, plan_json, refusal, revisions, serving, replaced, cost)


def draining_pods(intent: Intent) -> list[dict[str, Any]]:
    """The pods whose drain waits for them to fall idle (drain.draining)."""
    if not intent.accepted:
        return []
    assert intent.plan is not None
    return drain.draining(intent.revisions, intent.plan.revision, intent.serving)


@dataclass
class Desired:
    """The desired state: the step, the objects, the pods' pool marks, the children to
    delete, and the events the decisions make."""

    step: rollout.Step
    swap: Optional[RoleSwap]
    objects: list[dict[str, Any]]
    delete: list[Key]
    marks: list[tuple[str, bool]]          # (pod, leaves the pool)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    wake_after: Optional[float] = None
    # A same-generation write while a rollout or a drain moves on is its next step, not drift.
    moving: bool = False


def policy_of(plan: ServingPlan) -> rollout.Policy:
    spec = plan.spec
    r = spec.rollout
    min_ready = {role.role: min(r.minReadyReplicas or role.replicas, role.replicas)
                 for role in plan.roles}
    if r.drainSeconds is not None:
        drain_seconds = float(r.drainSeconds)
    else:
        predicted = plan.prediction
        drain_seconds = float(math.ceil(predicted["ttftSeconds"]) + DRAIN_MARGIN_SECONDS
                              if predicted else DEFAULT_DRAIN_SECONDS)
    budget = spec.engine.engineReadyTimeoutSeconds
    return rollout.Policy(strategy=r.strategy, min_ready=min_ready, drain_seconds=drain_seconds,
                          ready_timeout_seconds=float(budget),
                          downtime=f"up to the model load, engine.engineReadyTimeoutSeconds "
                                   f"= {budget} s")


def gpu_shortage(plan: ServingPlan, snapshot: Snapshot,
                 revisions: dict[str, rollout.Revision]) -> Optional[str]:
    """How many GPUs the new revision still needs on the nodes its placement selects, and
    how many are free there: their allocatable GPUs less what the pods bound to them
    request (the GPU-use cache); None when either is unknown."""
    if snapshot.nodes is None or snapshot.gpus_in_use is None:
        return None
    free = sum(max(parse_bytes((n.get("status") or {}).get("allocatable", {}).get(
        contract.GPU_RESOURCE, "0")) - snapshot.gpus_in_use.get(n["metadata"]["name"], 0), 0)
        for n in snapshot.nodes
        if placement.selects(plan.spec.placement, n["metadata"].get("labels") or {}))
    new = revisions.get(plan.revision)
    placed = {role: sum(1 for p in new.role_pods(role) if (p.get("spec") or {}).get("nodeName"))
              for role in contract.ROLES} if new else dict.fromkeys(contract.ROLES, 0)
    need = sum(max(r.replicas - placed[r.role], 0) * r.layout.gpusPerPod for r in plan.roles)
    return (f"the new revision needs {need} more {plan.spec.placement.gpuProduct} GPUs on "
            f"nodes matching {placement.describe(plan.spec.placement)}; free: {free}")


def desire(snapshot: Snapshot, intent: Intent, idle: dict[str, float]) -> Desired:
    """The desired state of an accepted spec; `idle`: seconds each draining pod has been
    idle (memory.Memory.idle)."""
    cr, plan, router, revisions = snapshot.cr, intent.plan, intent.router, intent.revisions
    assert plan is not None and router is not None
    previous = cr.get("status") or {}
    policy = policy_of(plan)
    now = snapshot.now

    def shortage() -> Optional[str]:
        return gpu_shortage(plan, snapshot, revisions)

    load = rollout.DrainLoad(idle, router_switched=bool(idle) and router.selects_only(
        snapshot, plan.revision))
    step = rollout.step(desired=plan.revision, serving=intent.serving, revisions=revisions,
                        previous=previous.get("rollout") or {}, policy=policy, now=now,
                        load=load, capacity_shortage=shortage, cost=intent.cost)
    swap = role_swap(plan, revisions.get(plan.revision)) \
        if step.serving == plan.revision else None
    draining: list[str] = []
    if swap is not None:
        # The old pods that left the pool: the router must have stopped discovering them.
        left = [p["metadata"]["name"] for p in swap.old.pods if p not in swap.leaving]
        switched = bool(left) and router.left_out(snapshot, plan.revision, left)
        step = swap_step(swap, step, policy, previous.get("rollout") or {}, now,
                         rollout.DrainLoad(idle, router_switched=switched), shortage,
                         intent.replaced, intent.cost, cr["metadata"]["name"])
        if step.leave_pool or left:
            draining += [p["metadata"]["name"] for p in swap.old.pods]
    down = drain.ScaleDown()
    if step.apply_desired:
        live = revisions.get(plan.revision)
        removed = drain.leaving(plan, live)
        switched = not removed or router.left_out(snapshot, step.serving, removed)
        down = drain.scale_down(plan, live, policy.drain_seconds, now,
                                rollout.DrainLoad(idle, router_switched=switched))
        draining += removed
    nodes = router.nodes_to_leave(snapshot)
    events = list(down.events)
    if nodes and nodes != router.asked_to_leave(snapshot):
        events.append(("Normal", "RouterMoving", f"the router leaves drained node "
                       f"{', '.join(nodes)}: its new pod starts elsewhere before the old one "
                       "stops"))
    with_monitor = plan.spec.monitoring.podMonitor and POD_MONITOR_CRD in snapshot.crds
    objects = desired_objects(
        cr, plan, router, with_pod_monitor=with_monitor, serving=step.serving,
        with_revision=step.apply_desired,
        with_capacity_rules=with_monitor and RULE_CRD in snapshot.crds,
        with_keda=plan.spec.autoscaling is not None and KEDA_CRD in snapshot.crds,
        replicas=down.replicas,
        router_edits=RouterEdits(tuple(sorted(set(draining))), tuple(nodes)))
    wake = [w for w in (step.wake_after, down.wake_after) if w is not None]
    return Desired(
        step=step, swap=swap, objects=objects,
        delete=_unwanted(snapshot, objects, (set(revisions) | {plan.revision}) - set(
            step.delete), step.retire),
        marks=down.marks + [(pod, True) for pod in step.leave_pool],
        events=events, wake_after=min(wake) if wake else None,
        moving=bool(step.events or events) or step.phase != "Steady"
        or down.wake_after is not None)


def _unwanted(snapshot: Snapshot, objects: list[dict[str, Any]], kept: set[str],
              retired: set[str]) -> list[Key]:
    """The CR's children to delete: not desired, not of a revision that stays (a draining
    one too) unless retired, and owned by this CR."""
    wanted = {(o["kind"], o["metadata"]["name"]) for o in objects}
    uid = snapshot.cr["metadata"]["uid"]
    return [key for key, live in snapshot.children.items()
            if key not in wanted
            and not (live["metadata"].get("labels", {}).get(contract.PAIRING_LABEL) in kept
                     and key[1] not in retired)
            and any(o.get("uid") == uid for o in live["metadata"].get("ownerReferences", []))]
