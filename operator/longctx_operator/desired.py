"""The whole object graph one LongContextDeployment becomes (pure)."""

from __future__ import annotations

from typing import Any

from longctx_engine.planner import plan as capacity_plan
from longctx_engine.roles import ServingPlan

from .builders.autoscaling import autoscaling_objects
from .builders.engine import engine_objects, pod_monitor
from .builders.router import router_objects


def desired_objects(cr: dict[str, Any], plan: ServingPlan, *,
                    with_pod_monitor: bool, with_capacity_rules: bool = False,
                    with_keda: bool = False) -> list[dict[str, Any]]:
    """Every child object, in apply order (config before the pods that read it)."""
    objects = engine_objects(cr, plan) + router_objects(cr, plan)
    if with_pod_monitor and plan.spec.monitoring.podMonitor:
        objects.append(pod_monitor(cr, plan))
    if with_capacity_rules or plan.spec.autoscaling is not None:
        objects += autoscaling_objects(cr, plan, capacity_plan(plan.spec),
                                       with_rules=with_capacity_rules, with_keda=with_keda)
    return objects
