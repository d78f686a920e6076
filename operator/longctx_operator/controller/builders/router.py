"""The llm-d router of one LongContextDeployment, as plain manifests (no API calls).

Objects (see docs/router.md):

- InferencePool `<cr>` (inference.networking.k8s.io/v1) selecting every serving pod of the CR,
  with one target port per engine rank of a pod (contract.SERVING_BASE_PORT + rank);
- the endpoint picker ("EPP", llm-d-router `cmd/epp`): ConfigMap, Deployment, Service,
  ServiceAccount, Role, RoleBinding and (with monitoring) a PodMonitor, all named `<cr>-epp`
  (picker.py);
- an HTTPRoute `<cr>` to a Gateway, only when `spec.router.gateway` is set;
- the decode pods' routing sidecar (`routing_sidecar`), which the decode workload builder
  puts in `initContainers`.

Ports per role under data parallelism (the picker's contract, llm-d/llm-d-router
`pkg/epp/datastore/datastore.go`): the picker makes one endpoint per (pod, pool target port)
and keeps only the ports listed in the pod annotation `llm-d.ai/active-ports` when that
annotation is present. So the pool lists the union of the ports of both roles, and every
serving pod carries `pod_annotations(role)` naming the ports it really serves: a PCP8
prefill pod (one engine) is one endpoint, a DP8 decode pod (a sidecar port per rank) is
eight. The older "one target port plus a rank header" layout
(`data-parallel-profile-handler`, `primaryPort`) is deprecated in llm-d-router.
"""

from __future__ import annotations

from typing import Any

from longctx_core import contract
from longctx_core.plan.roles import RolePlan, ServingPlan

from longctx_operator.controller.builders.picker import (POOL_API_VERSION, POOL_GROUP,
                                                         picker_objects, router_meta)
from longctx_operator.controller.builders.workload import restricted_container_security

SIDECAR_NAME = "routing-proxy"


# ---------------------------------------------------------------- ports


def pod_annotations(role: RolePlan) -> dict[str, str]:
    """Annotations every serving pod of a role must carry so that the picker offers only the
    ports that pod really serves (read by the picker's datastore)."""
    ports = ",".join(str(p) for p in role.ports.serving)
    return {contract.ACTIVE_PORTS_ANNOTATION: ports,
            contract.LEGACY_ACTIVE_PORTS_ANNOTATION: ports}


def inference_pool(cr: dict[str, Any], plan: ServingPlan, serving: str) -> dict[str, Any]:
    """The pool of the serving revision: only pods whose engines can complete a NIXL
    handshake with each other, so no request is prefilled by one revision and decoded by
    another; a rollout switches it to the new revision in one write."""
    cr_name = cr["metadata"]["name"]
    return {
        "apiVersion": POOL_API_VERSION, "kind": "InferencePool",
        "metadata": router_meta(cr, contract.inference_pool(cr_name)),
        "spec": {
            "selector": {"matchLabels": contract.serving_selector(cr_name, serving)},
            "targetPorts": [{"number": p} for p in plan.pool_target_ports],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "", "kind": "Service", "name": contract.picker(cr_name),
                "port": {"number": contract.PICKER_GRPC_PORT},
                # A dead picker must not take the model down: the gateway then load-balances.
                "failureMode": "FailOpen",
            },
        },
    }


def _http_route(cr: dict[str, Any], plan: ServingPlan) -> dict[str, Any]:
    spec = plan.spec
    cr_name, namespace = cr["metadata"]["name"], cr["metadata"]["namespace"]
    gateway = spec.router.gateway
    assert gateway is not None
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": router_meta(cr, contract.http_route(cr_name)),
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                            "name": gateway.name, "namespace": gateway.namespace or namespace}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool",
                                 "name": contract.inference_pool(cr_name)}],
                # A max-context prefill, its transfer and the answer (faults.py).
                "timeouts": {"request": f"{plan.prefill.faults.request_timeout_seconds}s"},
            }],
        },
    }


def llmd_objects(cr: dict[str, Any], plan: ServingPlan, serving: str) -> list[dict[str, Any]]:
    """Every llm-d router object of a CR (owner reference and router labels on each), the
    pool selecting the `serving` revision."""
    spec = plan.spec
    objects = [inference_pool(cr, plan, serving), *picker_objects(cr, spec, plan.capacity)]
    if spec.router.gateway is not None:
        objects.append(_http_route(cr, plan))
    return objects


# ---------------------------------------------------------------- decode sidecar


def sidecar_args(decode: RolePlan) -> list[str]:
    """Flags of llm-d-router `cmd/pd-sidecar` (pkg/sidecar/proxy/options.go), all explicit."""
    return [
        f"--port={decode.ports.serving[0]}",
        f"--model-server-port={decode.ports.http[0]}",
        f"--data-parallel-size={decode.layout.ranks_per_pod}",
        "--kv-connector=nixlv2",
        # Plain HTTP inside the pod network; `--secure-proxy` is the name v0.10 knows (newer
        # releases keep it as a deprecated alias of --secure-serving).
        "--secure-proxy=false",
        # Off, as in llm-d's guides: on, every decode pod would watch the InferencePool and
        # its pods through the API server (a token and a Role in each engine pod). Model pods
        # must only be reachable through the gateway (docs/router.md).
        "--enable-ssrf-protection=false",
        "--zap-encoder=json",
    ]


def routing_sidecar(decode: RolePlan) -> dict[str, Any]:
    """The decode pod's routing proxy as a native sidecar (for `initContainers`): rank i is
    served on its serving port and forwarded to the decode vLLM rank's HTTP port."""
    first = decode.ports.serving[0]
    health = {"path": "/health", "port": first}  # answered by the proxy itself
    return {
        "name": SIDECAR_NAME,
        "image": decode.spec.router.sidecarImage,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": sidecar_args(decode),
        "ports": [{"name": f"proxy-r{i}", "containerPort": port, "protocol": "TCP"}
                  for i, port in enumerate(decode.ports.serving)],
        # Gates the start of the engine container until the proxy listens.
        "startupProbe": {"tcpSocket": {"port": first}, "periodSeconds": 1,
                         "failureThreshold": 60},
        "livenessProbe": {"httpGet": health, "periodSeconds": 10, "timeoutSeconds": 5,
                          "failureThreshold": 3},
        "readinessProbe": {"httpGet": health, "periodSeconds": 5, "timeoutSeconds": 2,
                           "failureThreshold": 3},
        "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                      "limits": {"memory": "4Gi"}},
        "securityContext": restricted_container_security(own_user=True),
    }
