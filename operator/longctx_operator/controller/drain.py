"""The drains of one reconcile, wired to the cluster: which pods are draining, what their
engines still hold (the engine watch's last readings, engine_load.py), whether the router
still sends them requests, and the scale-down's pool marks. The decisions themselves are
rollout.step and rollout.scale_down, which get what is read here as data."""

from __future__ import annotations

import datetime
from typing import Any, Optional

from longctx_core import contract
from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller import rollout
from longctx_operator.controller.routers import Router
from longctx_operator.controller.engine_load import IdleTracker
from longctx_operator.controller.cluster import Cluster

# One per CR (namespace, name): since when each of its draining pods has been idle.
_TRACKERS: dict[tuple[str, str], IdleTracker] = {}


def look(cr: dict[str, Any], revisions: dict[str, rollout.Revision], desired: str,
         serving: Optional[str], now: datetime.datetime) -> dict[str, float]:
    """Seconds each draining pod has been idle: the other revisions' pods once the desired
    one serves, and the desired revision's pods a scale-down marked to leave, from the
    engine watch's readings (no engine is read here)."""
    pods = [p for name, rev in revisions.items() if serving == desired and name != desired
            for p in rev.pods]
    if desired in revisions:
        pods += [p for p in revisions[desired].pods
                 if (p["metadata"].get("annotations") or {}).get(rollout.DRAINING_ANNOTATION)]
    key = (cr["metadata"]["namespace"], cr["metadata"]["name"])
    if not pods:
        _TRACKERS.pop(key, None)
        return {}
    return _TRACKERS.setdefault(key, IdleTracker()).look(pods, now)


def drain_scale_down(kube: Cluster, cr: dict[str, Any], plan: ServingPlan, router: Router,
                     drain: float, revisions: dict[str, rollout.Revision],
                     desired: list[dict[str, Any]], idle: dict[str, float]
                     ) -> tuple[list[tuple[str, str, str]], Optional[float]]:
    """Pods a scale-down removes leave the pool first and go once drained (idle, or the
    window over): the desired StatefulSets keep their live replicas until then. With
    vllm-router, the router's pod template names the leaving pods, so it rolls to a pod
    that never discovers them. Returns the events and the seconds until the next look."""
    live = revisions.get(plan.revision)
    if live is None:
        return [], None
    now = datetime.datetime.now(datetime.timezone.utc)
    sets = {obj["metadata"]["labels"].get(contract.COMPONENT_LABEL): obj for obj in desired
            if obj["kind"] == "StatefulSet"
            and obj["metadata"]["labels"].get(contract.COMPONENT_LABEL) in contract.ROLES}
    removed = [p["metadata"]["name"] for role, obj in sets.items()
               for p in rollout.leaving(obj["spec"]["replicas"], live.statefulsets.get(role),
                                        live.role_pods(role))]
    switched = not removed or router.leave_out(kube, cr, desired, removed)
    events: list[tuple[str, str, str]] = []
    wake: Optional[float] = None
    for role, obj in sets.items():
        down = rollout.scale_down(obj["spec"]["replicas"], live.statefulsets.get(role),
                                  live.role_pods(role), drain, now,
                                  rollout.DrainLoad(idle, router_switched=switched))
        obj["spec"]["replicas"] = down.replicas
        for pods, leave in ((down.leave_pool, True), (down.rejoin_pool, False)):
            for pod in pods:
                kube.patch_metadata("v1", "Pod", cr["metadata"]["namespace"], pod,
                                    rollout.draining_marks(now, leave))
                events.append(
                    ("Normal", "ScaleDownDraining", f"pod {pod} leaves the pool and is removed "
                     f"once it holds no request, after {drain:.0f} s at most") if leave else
                    ("Normal", "ScaleDownCancelled", f"pod {pod} rejoins the pool"))
        if down.drained_early:
            events.append(("Normal", "ScaleDownDrained",
                           f"pods {', '.join(down.drained_early)} held no request for "
                           f"{rollout.IDLE_CONFIRM_SECONDS:.0f} s and are removed before the "
                           f"{drain:.0f} s window"))
        if down.wake_after is not None:
            wake = down.wake_after if wake is None else min(wake, down.wake_after)
    return events, wake
