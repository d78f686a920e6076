"""vLLM's own router (vllm-router) in front of one LongContextDeployment, as plain manifests.

With `spec.router.type: vllm-router` the CR gets a Deployment, Service, ServiceAccount, Role,
RoleBinding and (with monitoring) a PodMonitor, all named `<cr>-router`. vllm-router finds
the serving revision's prefill and decode pods through the Kubernetes API by label (its
`--service-discovery` with `--prefill-selector` / `--decode-selector`, the pairing label
included), reaches each on the serving port, and drives the P/D legs itself: the prefill leg
with `max_tokens` 1 and `do_remote_decode`, then the decode leg with the prefill's
`kv_transfer_params`, so NIXL moves the KV. A rollout switches it to a new revision by
changing the selectors: the Deployment rolls its one pod (surge first, so a router is always
there), and the new pod sees only the new revision's engines.

vllm-router 0.1.17's discovery adds a pod when it turns Ready and removes it when it is
deleted or stops being Ready; its source filters pod events by the selectors first, so a pod
whose labels stop matching (a scale-down taking it out of the pool) need not be dropped. So
the selectors require the serving label, and a drain also rolls the router: its pod
template names the pods leaving the pool (`draining_pods`), so the new router pod never
discovers them, and the old one finishes its requests in flight (it shuts down gracefully
on SIGTERM). A node drain names the drained nodes it runs on (`leaving_nodes`) the same
way, so it rolls off them.
"""

from __future__ import annotations

from typing import Any

from longctx_core import contract
from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller.builders.router_placement import router_placement
from longctx_operator.controller.builders.workload import (
    cluster_ip_service, nonroot_pod_security, restricted_container_security,
    service_account_objects)

COMPONENT = contract.ROUTER_COMPONENT
METRICS_PORT_NAME = "metrics"
# The pods a scale-down takes out of the pool, on the router's pod template: a change rolls
# the router, whose new pod discovers only the pods still serving.
DRAINING_PODS_ANNOTATION = "longctx.dev/draining-pods"
# The drained (cordoned) nodes its pods ran on, on the pod template: a change rolls it off them.
LEAVING_NODES_ANNOTATION = "longctx.dev/leaving-nodes"
HTTP_PORT_NAME = "http"
# The ports a pod of either role serves its first engine rank on (no sidecar in front).
WORKER_PORT = contract.SERVING_BASE_PORT


def _meta(cr: dict[str, Any]) -> dict[str, Any]:
    name = cr["metadata"]["name"]
    return {"name": contract.vllm_router(name), "namespace": cr["metadata"]["namespace"],
            "labels": contract.labels(name, COMPONENT),
            "ownerReferences": [contract.owner_reference(cr)]}


def _selector(cr_name: str, role: str, revision: str) -> list[str]:
    labels = {**contract.selector_labels(cr_name, role, revision), contract.SERVING_LABEL: "true"}
    return [f"{k}={v}" for k, v in labels.items()]


# By spec.router.sessionAffinity. cache_aware: in P/D mode 0.1.17 matches prefixes on token
# ids it cannot get from the engines, so it picks the pod with the fewest requests in flight
# (docs/router.md). sticky_least_loaded: a session, named by the client, stays on the pod it
# was given, the one holding the fewest sessions then.
POLICIES = {"prefix": "cache_aware", "sessionId": "sticky_least_loaded"}


def router_args(cr: dict[str, Any], plan: ServingPlan, revision: str) -> list[str]:
    """vllm-router 0.1.17's flags (vllm_router/router_args.py), every one explicit."""
    cr_name, namespace = cr["metadata"]["name"], cr["metadata"]["namespace"]
    faults = plan.prefill.faults
    return [
        "--host", "$(POD_IP)", "--port", str(contract.VLLM_ROUTER_PORT),
        "--vllm-pd-disaggregation", "--kv-connector", "nixl",
        "--policy", POLICIES[plan.spec.router.sessionAffinity],
        "--service-discovery", "--service-discovery-namespace", namespace,
        "--service-discovery-port", str(WORKER_PORT),
        "--prefill-selector", *_selector(cr_name, "prefill", revision),
        "--decode-selector", *_selector(cr_name, "decode", revision),
        # A max-context prefill, its transfer and the answer (faults.py).
        "--request-timeout-secs", str(faults.request_timeout_seconds),
        # Discovery adds one pod at a time, each waiting for its /health: a Ready pod that
        # cannot be reached must not hold up the others for the default 600 s.
        "--worker-startup-timeout-secs", "60",
        "--prometheus-host", "$(POD_IP)",
        "--prometheus-port", str(contract.VLLM_ROUTER_METRICS_PORT),
        "--log-level", "info",
    ]


def _drain_seconds(plan: ServingPlan) -> int:
    """How long a router pod that leaves keeps serving what it holds: vllm-router's own
    request timeout, the longest a request can be in flight through it."""
    return plan.prefill.faults.request_timeout_seconds


def _template_annotations(draining_pods: tuple[str, ...], leaving_nodes: tuple[str, ...]
                          ) -> dict[str, str]:
    named = {DRAINING_PODS_ANNOTATION: draining_pods, LEAVING_NODES_ANNOTATION: leaving_nodes}
    return {key: ",".join(sorted(set(names))) for key, names in named.items() if names}


def _deployment(cr: dict[str, Any], plan: ServingPlan, revision: str,
                draining_pods: tuple[str, ...], leaving_nodes: tuple[str, ...]
                ) -> dict[str, Any]:
    cr_name = cr["metadata"]["name"]
    probe_port = contract.VLLM_ROUTER_PORT
    template_meta: dict[str, Any] = {"labels": {**contract.labels(cr_name, COMPONENT),
                                                contract.PAIRING_LABEL: revision}}
    annotations = _template_annotations(draining_pods, leaving_nodes)
    if annotations:
        template_meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(cr),
        "spec": {
            "replicas": 1,
            # The new router is Ready before the old one goes: no gap in serving.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": contract.selector_labels(cr_name, COMPONENT)},
            "template": {
                # The pairing label names the revision this router serves; the operator
                # reads it back as the serving revision.
                "metadata": template_meta,
                "spec": {
                    **router_placement(plan.spec),
                    # Its endpoint goes at once; the requests the pod still holds last at
                    # most the request timeout, and it serves them until SIGTERM.
                    "terminationGracePeriodSeconds": _drain_seconds(plan) + 10,
                    "serviceAccountName": contract.vllm_router(cr_name),
                    "automountServiceAccountToken": True,
                    "securityContext": nonroot_pod_security(),
                    "containers": [{
                        "name": "vllm-router",
                        "image": plan.spec.router.vllmRouterImage,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["vllm-router"],
                        "args": router_args(cr, plan, revision),
                        "env": [{"name": "POD_IP", "valueFrom": {
                            "fieldRef": {"fieldPath": "status.podIP"}}}],
                        "ports": [
                            {"name": HTTP_PORT_NAME, "containerPort": contract.VLLM_ROUTER_PORT,
                             "protocol": "TCP"},
                            {"name": METRICS_PORT_NAME,
                             "containerPort": contract.VLLM_ROUTER_METRICS_PORT,
                             "protocol": "TCP"},
                        ],
                        "lifecycle": {"preStop": {"sleep": {"seconds": _drain_seconds(plan)}}},
                        "livenessProbe": {"httpGet": {"path": "/liveness", "port": probe_port},
                                          "periodSeconds": 10, "failureThreshold": 3},
                        # Ready once it has healthy workers of both roles.
                        "readinessProbe": {"httpGet": {"path": "/readiness",
                                                       "port": probe_port},
                                           "periodSeconds": 2, "failureThreshold": 3},
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                      "limits": {"memory": "4Gi"}},
                        "securityContext": restricted_container_security(read_only_root=False),
                    }],
                },
            },
        },
    }


def _service(cr: dict[str, Any]) -> dict[str, Any]:
    selector = contract.selector_labels(cr["metadata"]["name"], COMPONENT)
    return cluster_ip_service(_meta(cr), selector,
                              contract.VLLM_ROUTER_PORT, HTTP_PORT_NAME)


def router_rules() -> list[dict[str, Any]]:
    """What vllm-router's discovery does: list and watch the pods of its namespace (it
    filters the labels itself and never gets one pod)."""
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]


def _rbac(cr: dict[str, Any]) -> list[dict[str, Any]]:
    return service_account_objects(_meta(cr), router_rules())


def _disruption_budget(cr: dict[str, Any]) -> dict[str, Any]:
    """A node drain never evicts the one router pod: the operator rolls the Deployment off
    the node instead (`leaving_nodes`), which starts the new pod first."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(cr),
            "spec": {"maxUnavailable": 0,
                     "selector": {"matchLabels": contract.selector_labels(
                         cr["metadata"]["name"], COMPONENT)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def vllm_router_objects(cr: dict[str, Any], plan: ServingPlan, serving: str | None = None,
                        draining_pods: tuple[str, ...] = (), leaving_nodes: tuple[str, ...] = ()
                        ) -> list[dict[str, Any]]:
    """The router objects, discovering the `serving` revision (default: the plan's) except
    the `draining_pods`, its pods placed off the `leaving_nodes` (drained nodes)."""
    return [*_rbac(cr), _service(cr),
            _deployment(cr, plan, serving or plan.revision, draining_pods, leaving_nodes),
            _disruption_budget(cr)]


def vllm_router_pod_monitor(cr: dict[str, Any]) -> dict[str, Any]:
    cr_name = cr["metadata"]["name"]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": _meta(cr),
            "spec": {"selector": {"matchLabels": contract.selector_labels(cr_name, COMPONENT)},
                     "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics"}]}}


def draining_pods(obj: dict[str, Any]) -> set[str]:
    """The pods leaving the pool that a router pod (or pod template) never discovers."""
    annotations = obj["metadata"].get("annotations") or {}
    return {n for n in annotations.get(DRAINING_PODS_ANNOTATION, "").split(",") if n}


def leaving_nodes(deployment: dict[str, Any] | None) -> list[str]:
    """The drained nodes a router Deployment's pod template asks its pods to leave."""
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    return [n for n in annotations.get(LEAVING_NODES_ANNOTATION, "").split(",") if n]


def rolled_out(live: dict[str, Any] | None, revision: str,
               draining_pods: list[str] | None = None) -> bool:
    """Whether the live router Deployment runs only pods of a template that discovers
    `revision` (and never `draining_pods`, when given): its old pods are gone or
    terminating, so none sends a request to what it no longer selects."""
    if not live:
        return False
    have = ((live.get("spec") or {}).get("template") or {}).get("metadata") or {}
    status = live.get("status") or {}
    named = (have.get("annotations") or {}).get(DRAINING_PODS_ANNOTATION)
    return ((draining_pods is None or named == ",".join(sorted(set(draining_pods))))
            and (have.get("labels") or {}).get(contract.PAIRING_LABEL) == revision
            and status.get("observedGeneration") == live["metadata"].get("generation")
            and status.get("updatedReplicas", 0) == status.get("replicas", 0) ==
            status.get("availableReplicas", 0) == live["spec"].get("replicas", 1))


def serving_revision(deployment: dict[str, Any] | None) -> str | None:
    """The revision a router Deployment discovers (its pod template's pairing label)."""
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    return ((template.get("metadata") or {}).get("labels") or {}).get(contract.PAIRING_LABEL)
