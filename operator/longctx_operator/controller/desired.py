"""The object graph one LongContextDeployment becomes (pure)."""

from __future__ import annotations

from typing import Any

from longctx_core.sizing.planner import plan as capacity_plan
from longctx_core.sizing.roles import ServingPlan

from longctx_operator.controller.builders.autoscaling import autoscaling_objects
from longctx_operator.controller.builders.engine import pod_monitor, revision_objects, shared_engine_objects
from longctx_operator.controller.builders.network_policy import network_policy
from longctx_operator.controller.builders.picker import picker_pod_monitor
from longctx_operator.controller.builders.router import router_objects
from longctx_operator.controller.builders.vllm_router import vllm_router_pod_monitor


def desired_objects(cr: dict[str, Any], plan: ServingPlan, *, with_pod_monitor: bool,
                    serving: str | None = None, with_revision: bool = True,
                    with_capacity_rules: bool = False, with_keda: bool = False
                    ) -> list[dict[str, Any]]:
    """Every child object in apply order (config before the pods that read it): the plan's
    revision (unless a Recreate rollout still waits for the old one to stop) and the
    objects all revisions share, with the pool on the `serving` revision (default: the
    plan's). The capacity rules need the PrometheusRule CRD; spec.autoscaling becomes a
    KEDA ScaledObject `with_keda` (its CRD exists), else an HPA."""
    objects = revision_objects(cr, plan) if with_revision else []
    objects += shared_engine_objects(cr, plan) + router_objects(cr, plan, serving)
    if plan.spec.networkPolicy.enabled:
        objects.append(network_policy(cr, plan))
    if with_pod_monitor and plan.spec.monitoring.podMonitor:
        objects.append(pod_monitor(cr, plan))
        if plan.spec.router.enabled:
            objects.append(picker_pod_monitor(cr) if plan.spec.router.type == "llm-d"
                           else vllm_router_pod_monitor(cr))
    if with_capacity_rules or plan.spec.autoscaling is not None:
        objects += autoscaling_objects(cr, plan, capacity_plan(plan.spec),
                                       with_rules=with_capacity_rules, with_keda=with_keda)
    return objects
