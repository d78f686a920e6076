"""The client-facing endpoint of one LongContextDeployment (spec.endpoint), as plain manifests.

A Deployment of `longctx-endpoint` (the operator's image), its Service on
contract.ENDPOINT_PORT, a PodDisruptionBudget, and a ServiceAccount, Role and RoleBinding
that let it watch the CR's pods, all named `<cr>-endpoint`. It sends each answer through
the router (vllm-router's Ready pods, found by label; with llm-d, the Gateway in front of
the InferencePool) and continues it when its stream breaks (longctx_endpoint).

Its own changes cut no answer: the Deployment surges a new pod before an old one goes, an
old pod leaves the Service during its preStop sleep and then finishes its answers in
flight for at most drainSeconds, and the PDB lets a node drain evict one pod at a time.
"""

from __future__ import annotations

from typing import Any, Optional

from longctx_core import contract
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller.builders.router_placement import router_placement
from longctx_operator.controller.builders.workload import (
    cluster_ip_service, nonroot_pod_security, restricted_container_security,
    service_account_objects)

COMPONENT = contract.ENDPOINT_COMPONENT
HTTP_PORT_NAME = "http"
# Long enough for the Service's endpoints to drop a leaving pod before it stops listening.
PRE_STOP_SECONDS = 5
GATEWAY_PORT = 80


def router_url(spec: LongContextDeploymentSpec, namespace: str) -> Optional[str]:
    """The fixed address the endpoint sends requests to: llm-d's Gateway (None for
    vllm-router, whose pods it finds itself)."""
    if spec.router.type == "vllm-router":
        return None
    if spec.endpoint.routerURL:
        return spec.endpoint.routerURL
    gateway = spec.router.gateway
    assert gateway is not None, "deployed(spec) is false without a gateway"
    return f"http://{gateway.name}.{gateway.namespace or namespace}.svc:{GATEWAY_PORT}"


def deployed(spec: LongContextDeploymentSpec) -> bool:
    """Whether the CR gets an endpoint: it is enabled and has a router to send through."""
    return (spec.endpoint.enabled and spec.router.enabled
            and (spec.router.type == "vllm-router" or spec.router.gateway is not None
                 or spec.endpoint.routerURL is not None))


def url(cr_name: str, namespace: str) -> str:
    """The endpoint's Service URL, status.endpoint."""
    return f"http://{contract.endpoint(cr_name)}.{namespace}.svc:{contract.ENDPOINT_PORT}"


def _meta(cr: dict[str, Any]) -> dict[str, Any]:
    name = cr["metadata"]["name"]
    return {"name": contract.endpoint(name), "namespace": cr["metadata"]["namespace"],
            "labels": contract.labels(name, COMPONENT),
            "ownerReferences": [contract.owner_reference(cr)]}


def give_up_seconds(plan: ServingPlan) -> int:
    return plan.spec.endpoint.continuation.giveUpSeconds or \
        plan.prefill.faults.request_timeout_seconds


def drain_seconds(plan: ServingPlan) -> int:
    drain = plan.spec.endpoint.drainSeconds
    return plan.prefill.faults.request_timeout_seconds if drain is None else drain


def endpoint_args(cr: dict[str, Any], plan: ServingPlan) -> list[str]:
    """longctx-endpoint's flags (longctx_endpoint/cli.py), every one explicit."""
    meta = cr["metadata"]
    spec = plan.spec
    args = ["--host", "$(POD_IP)", "--port", str(contract.ENDPOINT_PORT),
            "--namespace", meta["namespace"], "--instance", meta["name"],
            "--max-attempts", str(spec.endpoint.continuation.maxAttempts),
            "--give-up-seconds", str(give_up_seconds(plan)),
            "--drain-seconds", str(drain_seconds(plan))]
    upstream = router_url(spec, meta["namespace"])
    if upstream:
        args += ["--router-url", upstream]
    return args


def _deployment(cr: dict[str, Any], plan: ServingPlan) -> dict[str, Any]:
    cr_name = cr["metadata"]["name"]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(cr),
        "spec": {
            "replicas": plan.spec.endpoint.replicas,
            # A new pod is Ready before an old one leaves.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": contract.selector_labels(cr_name, COMPONENT)},
            "template": {
                "metadata": {"labels": contract.labels(cr_name, COMPONENT)},
                "spec": {
                    **router_placement(plan.spec),
                    "terminationGracePeriodSeconds": PRE_STOP_SECONDS + drain_seconds(plan)
                    + 10,
                    "serviceAccountName": contract.endpoint(cr_name),
                    "automountServiceAccountToken": True,
                    "securityContext": nonroot_pod_security(),
                    "containers": [{
                        "name": "endpoint",
                        "image": plan.spec.endpoint.image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["longctx-endpoint"],
                        "args": endpoint_args(cr, plan),
                        "env": [{"name": "POD_IP", "valueFrom": {
                            "fieldRef": {"fieldPath": "status.podIP"}}}],
                        "ports": [{"name": HTTP_PORT_NAME,
                                   "containerPort": contract.ENDPOINT_PORT, "protocol": "TCP"}],
                        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
                        # 503 from SIGTERM on (it drains); no liveness probe, which would
                        # restart a pod finishing its answers.
                        "readinessProbe": {"httpGet": {"path": "/health",
                                                       "port": contract.ENDPOINT_PORT},
                                           "periodSeconds": 2, "failureThreshold": 2},
                        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                                      "limits": {"memory": "1Gi"}},
                        "securityContext": restricted_container_security(),
                    }],
                },
            },
        },
    }


def _service(cr: dict[str, Any]) -> dict[str, Any]:
    selector = contract.selector_labels(cr["metadata"]["name"], COMPONENT)
    return cluster_ip_service(_meta(cr), selector,
                              contract.ENDPOINT_PORT, HTTP_PORT_NAME)


def _disruption_budget(cr: dict[str, Any]) -> dict[str, Any]:
    """A node drain evicts one endpoint pod at a time; each finishes its answers first."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(cr),
            "spec": {"maxUnavailable": 1,
                     "selector": {"matchLabels": contract.selector_labels(
                         cr["metadata"]["name"], COMPONENT)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def endpoint_rules() -> list[dict[str, Any]]:
    """What its pod watch does: list and watch the CR's pods (it filters by label)."""
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def _rbac(cr: dict[str, Any]) -> list[dict[str, Any]]:
    return service_account_objects(_meta(cr), endpoint_rules())


def endpoint_objects(cr: dict[str, Any], plan: ServingPlan) -> list[dict[str, Any]]:
    """The endpoint's objects, none when the spec has no endpoint (deployed)."""
    if not deployed(plan.spec):
        return []
    return [*_rbac(cr), _service(cr), _deployment(cr, plan), _disruption_budget(cr)]


def endpoint_pod_monitor(cr: dict[str, Any]) -> dict[str, Any]:
    """Scrapes the endpoint's /metrics (its one port)."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(cr),
            "spec": {"selector": {"matchLabels": contract.selector_labels(
                cr["metadata"]["name"], COMPONENT)},
                "podMetricsEndpoints": [{"port": HTTP_PORT_NAME, "path": "/metrics"}]}}
