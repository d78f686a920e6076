"""The whole object graph one LongContextDeployment becomes (pure)."""

from __future__ import annotations

from typing import Any

from longctx_engine.roles import ServingPlan

from .builders.engine import engine_objects, pod_monitor
from .builders.router import router_objects


def desired_objects(cr: dict[str, Any], plan: ServingPlan, *,
                    with_pod_monitor: bool) -> list[dict[str, Any]]:
    """Every child object, in apply order (config before the pods that read it)."""
    objects = engine_objects(cr, plan) + router_objects(cr, plan)
    if with_pod_monitor and plan.spec.monitoring.podMonitor:
        objects.append(pod_monitor(cr, plan))
    return objects
