"""The llm-d endpoint picker ("EPP", llm-d-router `cmd/epp`) of one LongContextDeployment, as
plain manifests: its EndpointPickerConfig, ConfigMap, Deployment, Service, ServiceAccount, Role,
RoleBinding and PodMonitor (all named `<cr>-epp`), and the RouterReady condition read from its
Deployment. Also the names the pool and the decode sidecar share with it (router.py)."""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

import yaml

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.sizing.decider import PREFIX_BASED, decider
from longctx_core.sizing.planner import CapacityPlan
from longctx_core.sizing.prefix_index import prefix_index

from longctx_operator.controller.builders.digest import content_digest
from longctx_operator.controller.builders.router_placement import router_placement
from longctx_operator.controller.builders.workload import (
    nonroot_pod_security, restricted_container_security, service_account_objects)
from longctx_operator import kinds

COMPONENT = contract.ROUTER_COMPONENT
POOL_API_VERSION = kinds.KIND_BY_NAME["InferencePool"].api_version
POOL_GROUP = kinds.KIND_BY_NAME["InferencePool"].group
PICKER_CONFIG_API_VERSION = "llm-d.ai/v1alpha1"

# gRPC health service the picker answers for a single replica (cmd/epp/runner/health.go).
PICKER_HEALTH_SERVICE = "inference-extension"
PICKER_CONFIG_DIR = "/config"
PICKER_CONFIG_FILE = "epp-config.yaml"
PICKER_METRICS_PORT_NAME = "metrics"


# Plugin types the picker config is made of; a test checks that none is deprecated.
DEPRECATED_PLUGIN_TYPES = frozenset({
    "pd-profile-handler", "disagg-headers-handler", "prefill-header-handler", "by-label",
    "by-label-selector", "precise-prefix-cache-scorer", "data-parallel-profile-handler",
})


def router_meta(cr: dict[str, Any], name: str) -> dict[str, Any]:
    cr_meta = cr["metadata"]
    return {"name": name, "namespace": cr_meta["namespace"],
            "labels": contract.labels(cr_meta["name"], COMPONENT),
            "ownerReferences": [contract.owner_reference(cr)]}



# ---------------------------------------------------------------- picker config


def picker_config(spec: api.LongContextDeploymentSpec,
                  capacity: Optional[CapacityPlan] = None) -> dict[str, Any]:
    """The EndpointPickerConfig (llm-d.ai/v1alpha1): decode-first P/D with approximate prefix
    routing. Field names follow llm-d-router apix/config/v1alpha1 and each plugin's parameter
    struct; the picker decodes both strictly."""
    router = spec.router
    # Sized from the capacity plan unless the CR sets them (longctx_core.sizing.prefix_index).
    index = prefix_index(spec, capacity)
    # auto: the threshold the performance model derives for the layout (sizing/decider.py).
    chosen = decider(spec)
    decider_type = chosen.decider
    plugin: dict[str, Any] = {"type": decider_type}
    if decider_type == PREFIX_BASED:
        plugin["parameters"] = {"nonCachedTokens": chosen.non_cached_tokens,
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
            # A request no endpoint holds a prefix of (a new session) goes to the endpoint
            # least recently given one, so new sessions spread over the pods while the
            # prefix scorer keeps each later turn on the pod holding its prefix.
            {"type": "no-hit-lru-scorer"},
            {"type": "prefill-filter"},
            {"type": "decode-filter"},
            {"type": "max-score-picker"},
            plugin,
            {"type": "disagg-profile-handler",
             "parameters": {"deciders": {"prefill": decider_type}}},
        ],
        "schedulingProfiles": [
            {"name": "prefill", "plugins": [
                {"pluginRef": "prefill-filter"},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer", "weight": 1},
                {"pluginRef": "no-hit-lru-scorer", "weight": 1},
            ]},
            {"name": "decode", "plugins": [
                {"pluginRef": "decode-filter"},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
                {"pluginRef": "queue-scorer", "weight": 1},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
                {"pluginRef": "no-hit-lru-scorer", "weight": 1},
            ]},
        ],
    }


def picker_config_text(spec: api.LongContextDeploymentSpec,
                       capacity: Optional[CapacityPlan] = None) -> str:
    """The config file content, byte-for-byte stable for one spec (its hash restarts the picker)."""
    return _yaml(json.dumps(picker_config(spec, capacity)))


# Once per distinct config: every reconcile renders it, and PyYAML's representer is pure
# Python even with libyaml's emitter.
@functools.lru_cache(maxsize=256)
def _yaml(config_json: str) -> str:
    return yaml.dump(json.loads(config_json), Dumper=yaml.CSafeDumper, sort_keys=False,
                     default_flow_style=False)


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


def _picker_configmap(cr: dict[str, Any], text: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": router_meta(cr, contract.picker(cr["metadata"]["name"])),
            "data": {PICKER_CONFIG_FILE: text}}


def _picker_deployment(cr: dict[str, Any], spec: api.LongContextDeploymentSpec,
                       text: str) -> dict[str, Any]:
    cr_name, namespace = cr["metadata"]["name"], cr["metadata"]["namespace"]
    name = contract.picker(cr_name)
    grpc_probe = {"port": contract.PICKER_HEALTH_PORT, "service": PICKER_HEALTH_SERVICE}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": router_meta(cr, name),
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
                    **router_placement(spec),
                    "serviceAccountName": name,
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": 130,  # --drain-timeout 30s plus shutdown
                    "securityContext": nonroot_pod_security(fs_group=True),
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
                        "securityContext": restricted_container_security(own_user=True),
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
        "metadata": router_meta(cr, contract.picker(cr_name)),
        "spec": {"selector": {"matchLabels": contract.selector_labels(cr_name, COMPONENT)},
                 "podMetricsEndpoints": [{"port": PICKER_METRICS_PORT_NAME, "path": "/metrics"}]},
    }


def _picker_service(cr: dict[str, Any]) -> dict[str, Any]:
    cr_name = cr["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": router_meta(cr, contract.picker(cr_name)),
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
    return service_account_objects(router_meta(cr, contract.picker(cr["metadata"]["name"])),
                                   picker_rules())


def picker_objects(cr: dict[str, Any], spec: api.LongContextDeploymentSpec,
                   capacity: CapacityPlan) -> list[dict[str, Any]]:
    """The picker's ConfigMap, ServiceAccount, Role, RoleBinding, Service and Deployment."""
    text = picker_config_text(spec, capacity)
    return [_picker_configmap(cr, text), *_picker_rbac(cr), _picker_service(cr),
            _picker_deployment(cr, spec, text)]


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
