"""The llm-d router of one LongContextDeployment, as plain manifests (no API calls).

Objects (see docs/router.md):

- InferencePool `<cr>` (inference.networking.k8s.io/v1) selecting every serving pod of the CR,
  with one target port per engine rank of a pod (contract.SERVING_BASE_PORT + rank);
- the endpoint picker ("EPP", llm-d-router `cmd/epp`): ConfigMap, Deployment, Service,
  ServiceAccount, Role, RoleBinding and (with monitoring) a PodMonitor, all named `<cr>-epp`;
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

import yaml

from longctx_engine import api, contract
from longctx_engine.prefix_index import prefix_index
from longctx_engine.roles import RolePlan, ServingPlan

from .digest import content_digest
from .vllm_router import vllm_router_objects

COMPONENT = contract.ROUTER_COMPONENT
POOL_API_VERSION = contract.KIND_BY_NAME["InferencePool"].api_version
POOL_GROUP = contract.KIND_BY_NAME["InferencePool"].group
PICKER_CONFIG_API_VERSION = "llm-d.ai/v1alpha1"

# gRPC health service the picker answers for a single replica (cmd/epp/runner/health.go).
PICKER_HEALTH_SERVICE = "inference-extension"
PICKER_CONFIG_DIR = "/config"
PICKER_CONFIG_FILE = "epp-config.yaml"
PICKER_METRICS_PORT_NAME = "metrics"

SIDECAR_NAME = "routing-proxy"
NONROOT_UID = 65532  # the llm-d images' user (Dockerfile.epp, Dockerfile.sidecar)

# Plugin types the picker config is made of; a test checks that none is deprecated.
DEPRECATED_PLUGIN_TYPES = frozenset({
    "pd-profile-handler", "disagg-headers-handler", "prefill-header-handler", "by-label",
    "by-label-selector", "precise-prefix-cache-scorer", "data-parallel-profile-handler",
})
DECIDER_TYPES = {"always": "always-disagg-pd-decider", "prefix-based": "prefix-based-pd-decider"}



# ---------------------------------------------------------------- ports


def pod_annotations(role: RolePlan) -> dict[str, str]:
    """Annotations every serving pod of a role must carry so that the picker offers only the
    ports that pod really serves (read by the picker's datastore)."""
    ports = ",".join(str(p) for p in role.ports.serving)
    return {contract.ACTIVE_PORTS_ANNOTATION: ports,
            contract.LEGACY_ACTIVE_PORTS_ANNOTATION: ports}


# ---------------------------------------------------------------- picker config


def picker_config(spec: api.LongContextDeploymentSpec) -> dict[str, Any]:
    """The EndpointPickerConfig (llm-d.ai/v1alpha1): decode-first P/D with approximate prefix
    routing. Field names follow llm-d-router apix/config/v1alpha1 and each plugin's parameter
    struct; the picker decodes both strictly."""
    router = spec.router
    # Sized from the capacity plan unless the CR sets them (longctx_engine.prefix_index).
    index = prefix_index(spec)
    decider_type = DECIDER_TYPES[router.disaggregation.decider]
    decider: dict[str, Any] = {"type": decider_type}
    if router.disaggregation.decider == "prefix-based":
        decider["parameters"] = {"nonCachedTokens": router.disaggregation.nonCachedTokens,
                                 "promptTokens": router.disaggregation.promptTokens}
    return {
        "apiVersion": PICKER_CONFIG_API_VERSION,
        "kind": "EndpointPickerConfig",
        "plugins": [
            # autoTune off: the picker would size the LRU from GPU block counts, which
            # under-state what a rank holds with CPU offload and HiSparse host pools.
            {"type": "approx-prefix-cache-producer",
             "parameters": {"autoTune": False, "blockSizeTokens": index.blockSize,
                            "maxPrefixTokensToMatch": index.maxPrefixTokensToMatch,
                            "lruCapacityPerServer": index.lruCapacityPerServer}},
            {"type": "prefix-cache-scorer"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "prefill-filter"},
            {"type": "decode-filter"},
            {"type": "max-score-picker"},
            decider,
            {"type": "disagg-profile-handler",
             "parameters": {"deciders": {"prefill": decider_type}}},
        ],
        "schedulingProfiles": [
            {"name": "prefill", "plugins": [
                {"pluginRef": "prefill-filter"},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer", "weight": 1},
            ]},
            {"name": "decode", "plugins": [
                {"pluginRef": "decode-filter"},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer", "weight": 1},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
            ]},
        ],
    }


def picker_config_text(spec: api.LongContextDeploymentSpec) -> str:
    """The config file content, byte-for-byte stable for one spec (its hash restarts the picker)."""
    # libyaml's emitter: PyYAML's pure-Python one was a tenth of the operator's CPU at a
    # burst of new CRs.
    return yaml.dump(picker_config(spec), Dumper=yaml.CSafeDumper, sort_keys=False,
                     default_flow_style=False)


# ---------------------------------------------------------------- objects


def _meta(cr: dict[str, Any], name: str) -> dict[str, Any]:
    cr_meta = cr["metadata"]
    return {"name": name, "namespace": cr_meta["namespace"],
            "labels": contract.labels(cr_meta["name"], COMPONENT),
            "ownerReferences": [contract.owner_reference(cr)]}


def _restricted_container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "runAsUser": NONROOT_UID, "runAsGroup": NONROOT_UID,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def picker_args(cr_name: str, namespace: str) -> list[str]:
    return [
        f"--pool-name={contract.inference_pool(cr_name)}",
        f"--pool-namespace={namespace}",
        f"--pool-group={POOL_GROUP}",
        f"--config-file={PICKER_CONFIG_DIR}/{PICKER_CONFIG_FILE}",
        f"--grpc-port={contract.PICKER_GRPC_PORT}",
        f"--grpc-health-port={contract.PICKER_HEALTH_PORT}",
        f"--metrics-port={contract.PICKER_METRICS_PORT}",
        # The gateway talks TLS to the picker (self-signed unless --cert-path).
        "--secure-serving=true",
        # /metrics auth needs cluster-scoped tokenreviews/subjectaccessreviews; the picker's
        # Role is namespaced and minimal, so metrics are served without auth (ClusterIP only).
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--zap-encoder=json",
    ]


def inference_pool(cr: dict[str, Any], plan: ServingPlan, serving: str) -> dict[str, Any]:
    """The pool of the serving revision: only pods whose engines can complete a NIXL
    handshake with each other, so no request is prefilled by one revision and decoded by
    another; a rollout switches it to the new revision in one write."""
    cr_name = cr["metadata"]["name"]
    return {
        "apiVersion": POOL_API_VERSION, "kind": "InferencePool",
        "metadata": _meta(cr, contract.inference_pool(cr_name)),
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


def _picker_configmap(cr: dict[str, Any], text: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(cr, contract.picker(cr["metadata"]["name"])),
            "data": {PICKER_CONFIG_FILE: text}}


def _picker_deployment(cr: dict[str, Any], spec: api.LongContextDeploymentSpec,
                       text: str) -> dict[str, Any]:
    cr_name, namespace = cr["metadata"]["name"], cr["metadata"]["namespace"]
    name = contract.picker(cr_name)
    grpc_probe = {"port": contract.PICKER_HEALTH_PORT, "service": PICKER_HEALTH_SERVICE}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(cr, name),
        "spec": {
            # One replica: approximate-prefix state lives in one process (llm-d guides).
            "replicas": 1,
            # Never two pickers with diverging prefix state during a rollout.
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": contract.selector_labels(cr_name, COMPONENT)},
            "template": {
                "metadata": {
                    "labels": contract.labels(cr_name, COMPONENT),
                    # The picker reads its config once at start: a new hash rolls the pod.
                    "annotations": {contract.PICKER_CONFIG_ANNOTATION: content_digest(text)},
                },
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": 130,  # --drain-timeout 30s plus shutdown
                    "securityContext": {"runAsNonRoot": True, "runAsUser": NONROOT_UID,
                                        "runAsGroup": NONROOT_UID, "fsGroup": NONROOT_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "epp",
                        "image": spec.router.pickerImage,
                        "imagePullPolicy": "IfNotPresent",
                        "args": picker_args(cr_name, namespace),
                        "ports": [
                            {"name": "grpc", "containerPort": contract.PICKER_GRPC_PORT,
                             "protocol": "TCP"},
                            {"name": "grpc-health", "containerPort": contract.PICKER_HEALTH_PORT,
                             "protocol": "TCP"},
                            {"name": PICKER_METRICS_PORT_NAME,
                             "containerPort": contract.PICKER_METRICS_PORT,
                             "protocol": "TCP"},
                        ],
                        "env": [
                            {"name": "NAMESPACE",
                             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            {"name": "POD_NAME",
                             "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        ],
                        "livenessProbe": {"grpc": grpc_probe, "initialDelaySeconds": 5,
                                          "periodSeconds": 10, "failureThreshold": 3},
                        "readinessProbe": {"grpc": grpc_probe, "periodSeconds": 2,
                                           "failureThreshold": 3},
                        "resources": {"requests": {"cpu": "4", "memory": "8Gi"},
                                      "limits": {"memory": "16Gi"}},
                        "securityContext": _restricted_container_security(),
                        "volumeMounts": [
                            {"name": "config", "mountPath": PICKER_CONFIG_DIR, "readOnly": True},
                            {"name": "tmp", "mountPath": "/tmp"},
                        ],
                    }],
                    "volumes": [
                        {"name": "config", "configMap": {"name": name}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                },
            },
        },
    }


def picker_pod_monitor(cr: dict[str, Any]) -> dict[str, Any]:
    """Scrapes the picker's /metrics (monitoring.coreos.com/v1), plain HTTP without auth
    (picker_args)."""
    cr_name = cr["metadata"]["name"]
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": _meta(cr, contract.picker(cr_name)),
        "spec": {"selector": {"matchLabels": contract.selector_labels(cr_name, COMPONENT)},
                 "podMetricsEndpoints": [{"port": PICKER_METRICS_PORT_NAME, "path": "/metrics"}]},
    }


def _picker_service(cr: dict[str, Any]) -> dict[str, Any]:
    cr_name = cr["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(cr, contract.picker(cr_name)),
        "spec": {
            "type": "ClusterIP",
            "selector": contract.selector_labels(cr_name, COMPONENT),
            "ports": [
                {"name": "grpc-ext-proc", "port": contract.PICKER_GRPC_PORT,
                 "targetPort": "grpc", "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
                {"name": "http-metrics", "port": contract.PICKER_METRICS_PORT,
                 "targetPort": PICKER_METRICS_PORT_NAME, "protocol": "TCP"},
            ],
        },
    }


READ = ["get", "list", "watch"]


def picker_rules() -> list[dict[str, Any]]:
    """Exactly what the picker reads: its pool's pods, the pool, objectives and rewrites."""
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": list(READ)},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": list(READ)},
        {"apiGroups": ["llm-d.ai", "inference.networking.x-k8s.io"],
         "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": list(READ)},
    ]


def _picker_rbac(cr: dict[str, Any]) -> list[dict[str, Any]]:
    name = contract.picker(cr["metadata"]["name"])
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cr, name),
         "automountServiceAccountToken": True},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _meta(cr, name), "rules": picker_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(cr, name),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name,
                       "namespace": cr["metadata"]["namespace"]}]},
    ]


def _http_route(cr: dict[str, Any], plan: ServingPlan) -> dict[str, Any]:
    spec = plan.spec
    cr_name, namespace = cr["metadata"]["name"], cr["metadata"]["namespace"]
    gateway = spec.router.gateway
    assert gateway is not None
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": _meta(cr, contract.http_route(cr_name)),
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


def router_objects(cr: dict[str, Any], plan: ServingPlan,
                   serving: str | None = None) -> list[dict[str, Any]]:
    """Every router object of a CR (owner reference and router labels on each), the pool
    selecting the `serving` revision (default: the plan's); [] when spec.router.enabled is
    false."""
    spec = plan.spec
    if not spec.router.enabled:
        return []
    if spec.router.type == "vllm-router":
        return vllm_router_objects(cr, plan, serving)
    text = picker_config_text(spec)
    objects = [
        inference_pool(cr, plan, serving or plan.revision),
        _picker_configmap(cr, text),
        *_picker_rbac(cr),
        _picker_service(cr),
        _picker_deployment(cr, spec, text),
    ]
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
        "securityContext": _restricted_container_security(),
    }


# ---------------------------------------------------------------- status


def picker_status(deployment: dict[str, Any] | None) -> tuple[bool, str, str]:
    """(ready, reason, message) of the RouterReady condition from the picker Deployment."""
    if deployment is None:
        return False, "PickerMissing", "the endpoint picker Deployment does not exist yet"
    name = deployment.get("metadata", {}).get("name", "endpoint picker")
    generation = deployment.get("metadata", {}).get("generation")
    status = deployment.get("status") or {}
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return False, "PickerProgressing", f"Deployment {name}: the new generation " \
                                           f"{generation} is not observed yet"
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    failure = conditions.get("ReplicaFailure")
    if failure and failure.get("status") == "True":
        return False, "PickerReplicaFailure", \
            f"Deployment {name}: {failure.get('message') or failure.get('reason')}"
    progressing = conditions.get("Progressing")
    if progressing and progressing.get("status") == "False":
        return False, "PickerStalled", \
            f"Deployment {name}: {progressing.get('message') or progressing.get('reason')}"
    updated = status.get("updatedReplicas", 0)
    available = status.get("availableReplicas", 0)
    if wanted and updated >= wanted and available >= wanted:
        return True, "PickerAvailable", f"Deployment {name}: {available}/{wanted} replicas available"
    return False, "PickerUnavailable", \
        f"Deployment {name}: {available}/{wanted} replicas available, {updated} updated"
