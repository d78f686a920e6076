"""What the drains of one reconcile contribute to its desired state (pure): the pods that
drain (whose idle time the operator's memory tracks, memory.py), and for a scale-down the
replicas each StatefulSet keeps until its leaving pods have drained, the pods' pool marks
and the events. The decisions themselves are rollout.scale_down's."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Optional

from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller import rollout


def draining(revisions: dict[str, rollout.Revision], desired: str, serving: Optional[str]
             ) -> list[dict[str, Any]]:
    """The pods that drain: the other revisions' pods once the desired one serves, and the
    desired revision's pods a scale-down marked to leave."""
    pods = [p for name, rev in revisions.items() if serving == desired and name != desired
            for p in rev.pods]
    if desired in revisions:
        pods += [p for p in revisions[desired].pods
                 if (p["metadata"].get("annotations") or {}).get(rollout.DRAINING_ANNOTATION)]
    return pods


def leaving(plan: ServingPlan, live: Optional[rollout.Revision]) -> list[str]:
    """The pods of the plan's revision (`live`) that a scale-down removes."""
    if live is None:
        return []
    return [p["metadata"]["name"] for role in plan.roles
            for p in rollout.leaving(role.replicas, live.statefulsets.get(role.role),
                                     live.role_pods(role.role))]


@dataclass
class ScaleDown:
    """A scale-down's part of the desired state."""

    replicas: dict[str, int] = field(default_factory=dict)   # role -> StatefulSet replicas
    marks: list[tuple[str, bool]] = field(default_factory=list)   # (pod, leaves the pool)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    wake_after: Optional[float] = None


def scale_down(plan: ServingPlan, live: Optional[rollout.Revision], drain: float,
               now: datetime.datetime, load: rollout.DrainLoad) -> ScaleDown:
    """Pods a scale-down removes leave the pool first and go once drained (idle, or the
    window over): their StatefulSets keep their live replicas until then."""
    out = ScaleDown()
    if live is None:
        return out
    for role in plan.roles:
        down = rollout.scale_down(role.replicas, live.statefulsets.get(role.role),
                                  live.role_pods(role.role), drain, now, load)
        out.replicas[role.role] = down.replicas
        out.marks += [(pod, True) for pod in down.leave_pool]
        out.marks += [(pod, False) for pod in down.rejoin_pool]
        out.events += [("Normal", "ScaleDownDraining", f"pod {pod} leaves the pool and is "
                        f"removed once it holds no request, after {drain:.0f} s at most")
                       for pod in down.leave_pool]
        out.events += [("Normal", "ScaleDownCancelled", f"pod {pod} rejoins the pool")
                       for pod in down.rejoin_pool]
        if down.drained_early:
            out.events.append(("Normal", "ScaleDownDrained",
                               f"pods {', '.join(down.drained_early)} held no request for "
                               f"{rollout.IDLE_CONFIRM_SECONDS:.0f} s and are removed before "
                               f"the {drain:.0f} s window"))
        if down.wake_after is not None:
            out.wake_after = down.wake_after if out.wake_after is None else min(
                out.wake_after, down.wake_after)
    return out
