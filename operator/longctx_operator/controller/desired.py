"""The object graph one LongContextDeployment becomes (pure)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller.builders.autoscaling import autoscaling_objects
from longctx_operator.controller.builders.endpoint import (deployed as endpoint_deployed,
                                                           endpoint_objects, endpoint_pod_monitor)
from longctx_operator.controller.builders.engine import pod_monitor, revision_objects, shared_engine_objects
from longctx_operator.controller.builders.network_policy import network_policy
from longctx_operator.controller.routers import Router, RouterEdits


def desired_objects(cr: dict[str, Any], plan: ServingPlan, router: Router, *,
                    with_pod_monitor: bool,
                    serving: str | None = None, with_revision: bool = True,
                    with_capacity_rules: bool = False, with_keda: bool = False,
                    replicas: Mapping[str, int] = MappingProxyType({}),
                    router_edits: RouterEdits = RouterEdits()) -> list[dict[str, Any]]:
    """Every child object in apply order (config before the pods that read it): the plan's
    revision (unless a Recreate rollout still waits for the old one to stop) and the
    objects all revisions share, with the pool on the `serving` revision (default: the
    plan's). The drains contribute as inputs: the `replicas` a scale-down keeps while its
    pods drain, and what they ask of the router (`router_edits`). The capacity rules need
    the PrometheusRule CRD; spec.autoscaling becomes a KEDA ScaledObject `with_keda` (its
    CRD exists), else an HPA."""
    objects = revision_objects(cr, plan, router, replicas) if with_revision else []
    objects += shared_engine_objects(cr, plan) + router.objects(
        cr, plan, serving or plan.revision, router_edits)
    objects += endpoint_objects(cr, plan)
    if plan.spec.networkPolicy.enabled:
        objects.append(network_policy(cr, plan))
    if with_pod_monitor and plan.spec.monitoring.podMonitor:
        objects.append(pod_monitor(cr, plan))
        router_monitor = router.pod_monitor(cr)
        if router_monitor is not None:
            objects.append(router_monitor)
        if endpoint_deployed(plan.spec):
            objects.append(endpoint_pod_monitor(cr))
    if with_capacity_rules or plan.spec.autoscaling is not None:
        objects += autoscaling_objects(cr, plan, plan.capacity,
                                       with_rules=with_capacity_rules, with_keda=with_keda)
    return objects
