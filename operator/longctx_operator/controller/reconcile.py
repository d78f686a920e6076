"""One level-based reconcile of a LongContextDeployment: observe, desire, act, report.

It observes once: one snapshot of everything it reads, from the watch caches
(observe.py). What it desires is a pure function of the CR, that snapshot and the draining
pods' idle times (desire.py); it then writes only what differs (act.py) and derives the
status from the snapshot and the API server's answers to its writes, writing it only when
it changed. The operator's memory between reconciles (memory.py) is passed in.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any

from longctx_core import contract
from longctx_core.sizing.scaling import scale_status

from longctx_operator import metrics
from longctx_operator.controller import data_path
from longctx_operator.controller.act import Acts, act
from longctx_operator.controller.builders import endpoint as endpoint_builder
from longctx_operator.controller.cluster import Cluster
from longctx_operator.controller.desire import Desired, Intent, desire, draining_pods, intend
from longctx_operator.controller.engine_documents import rollout_cause
from longctx_operator.controller.memory import Memory
from longctx_operator.controller.observe import Snapshot, observe
from longctx_operator.controller.rollout import Revision, role_revision_of
from longctx_operator.controller.status import (Observed, compute_status, merge_patch,
                                                status_changed)


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


def reconcile(kube: Cluster, cr: dict[str, Any], memory: Memory) -> Outcome:
    started = time.monotonic()
    outcome = Outcome()
    try:
        _reconcile(kube, cr, memory, outcome)
        metrics.RECONCILES.labels(result="refused" if outcome.phase == "Refused" else "ok").inc()
        return outcome
    except Exception:
        metrics.RECONCILES.labels(result="error").inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)


def _reconcile(kube: Cluster, cr: dict[str, Any], memory: Memory, outcome: Outcome) -> None:
    meta = cr["metadata"]
    key = (meta["namespace"], meta["name"])
    snapshot = observe(kube, cr, _utcnow())
    intent = intend(snapshot, memory.plans)
    desired: Desired | None = None
    acts = Acts()
    if intent.accepted:
        desired = desire(snapshot, intent, memory.idle(key, draining_pods(intent),
                                                       snapshot.now))
        acts = act(kube, snapshot, desired)
        outcome.events += desired.events
        outcome.applied += acts.applied
        outcome.deleted += [f"{kind}/{name}" for kind, name in acts.deleted]
        outcome.rerendered += acts.rerendered
        outcome.events += acts.events + desired.step.events
        outcome.rollout_phase = desired.step.phase
        if desired.wake_after is not None:
            outcome.wake_within(desired.wake_after)
    _report(kube, memory, snapshot.after(acts.written, acts.deleted), intent, desired, outcome)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _report(kube: Cluster, memory: Memory, snapshot: Snapshot, intent: Intent,
            desired: Desired | None, outcome: Outcome) -> None:
    """Derives the status from the snapshot after this reconcile's writes and writes it
    when it changed."""
    cr = snapshot.cr
    name, namespace = cr["metadata"]["name"], cr["metadata"]["namespace"]
    key = (namespace, name)
    previous = cr.get("status") or {}
    plan, spec, router, refusal = intent.plan, intent.spec, intent.router, intent.refusal
    step = desired.step if desired is not None else None
    swap = desired.swap if desired is not None else None
    revisions = snapshot.revisions()
    serving_rev = step.serving if step is not None else previous.get("revision")
    # Within the plan's revision, each role's own role revision (another revision has one).
    focus = dict(plan.role_revisions) if plan is not None and serving_rev == plan.revision \
        else {}
    if swap is not None and step is not None and not step.leave_pool and swap.leaving:
        # Until the swap's switch, the old role revision serves.
        focus.update({r: role_revision_of(s) for r, s in swap.old.statefulsets.items()})
    serving = revisions.get(serving_rev or "")
    if serving is not None and focus:
        serving = serving.focused(focus)
    observed = Observed(
        statefulsets=dict(serving.statefulsets) if serving else {},
        pods=[p for r in contract.ROLES for p in serving.role_pods(r)] if serving else [],
        router=router.status(snapshot) if router is not None else None)
    if spec is None:
        desired_replicas = dict.fromkeys(contract.ROLES, 0)
    elif refusal or plan is None:   # the replicas actually running, not the refused spec's
        desired_replicas = {role: (observed.statefulsets.get(role) or {}).get("spec", {}).get(
            "replicas", 0) for role in contract.ROLES}
    else:
        desired_replicas = {role.role: role.replicas for role in plan.roles}
    memory.count_zero_capacity(key, any(
        desired_replicas.get(role) and not ((observed.statefulsets.get(role) or {}).get(
            "status") or {}).get("readyReplicas") for role in contract.ROLES))
    status = compute_status(cr, refusal=refusal, plan=intent.plan_json, observed=observed,
                            desired_replicas=desired_replicas,
                            endpoint=(endpoint_builder.url(name, namespace)
                                      if spec is not None and endpoint_builder.deployed(spec)
                                      else router.endpoint(name, namespace) if router else None),
                            previous=previous, rollout=step,
                            data_path=_data_path(memory, snapshot, intent, revisions, outcome))
    status.update(scale_status(name, spec, observed.pods))
    answered, answer_events = memory.answers.take(key, previous.get("answers"))
    if answered is not None:
        status["answers"] = answered
    outcome.events += answer_events
    cause = rollout_cause(outcome.rerendered, bool(outcome.applied), cr, previous,
                          intent.replaced.changed if intent.replaced else ())
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


def _data_path(memory: Memory, snapshot: Snapshot, intent: Intent,
               revisions: dict[str, Revision], outcome: Outcome) -> dict[str, str]:
    """The DataPathHealthy condition from the engines' restarts (every revision's pods)
    and the faults the engine watch counted; an Event for each fault not yet reported."""
    meta = snapshot.cr["metadata"]
    key = (meta["namespace"], meta["name"])
    now = snapshot.now
    policy = intent.plan.decode.faults.kv_load_failure_policy if intent.plan is not None \
        else "fail"
    faults = data_path.restarted([p for r in revisions.values() for p in r.pods], now, policy)
    faults += memory.recorded.faults(key, now, policy)
    outcome.events += [("Warning", f.reason, f.message)
                       for f in memory.recorded.unreported(key, faults)]
    condition, clears_in = data_path.condition(faults, now)
    if clears_in is not None:
        outcome.wake_within(clears_in)
    return condition


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
