"""The whole object graph one LongContextDeployment becomes (pure)."""

from __future__ import annotations

from typing import Any

from longctx_engine.api import LongContextDeploymentSpec

from .builders.engine import engine_objects, pod_monitor
from .builders.router import router_objects

# Kinds the operator may create, with the apiVersion it uses; an object of one of these
# kinds that carries the CR's labels but is no longer desired is deleted.
MANAGED_KINDS = (
    ("v1", "ConfigMap"), ("v1", "Service"), ("apps/v1", "StatefulSet"),
    ("policy/v1", "PodDisruptionBudget"), ("apps/v1", "Deployment"), ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"), ("monitoring.coreos.com/v1", "PodMonitor"),
)


def desired_objects(cr: dict[str, Any], spec: LongContextDeploymentSpec, *,
                    with_pod_monitor: bool) -> list[dict[str, Any]]:
    """Every child object, in apply order (config before the pods that read it)."""
    objects = engine_objects(cr, spec) + router_objects(cr, spec)
    if with_pod_monitor and spec.monitoring.podMonitor:
        objects.append(pod_monitor(cr, spec))
    return objects
