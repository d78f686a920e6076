"""The pod contract: every fact that the operator's objects, the engine entrypoint, the
chart's RBAC and the tests must agree on, in one place.

Names, labels, ports, environment keys, mount paths and the roles (the kinds the operator
manages are its own table, longctx_operator/kinds.py). Nothing else spells a port number or
a child's name; a change here reaches every reader. Stdlib only: the operator and the engine pod import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP = "longctx.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LongContextDeployment"
PLURAL = "longcontextdeployments"

ROLES = ("prefill", "decode")
FIELD_MANAGER = "longctx-operator"
# The extended resource an engine pod requests its GPUs as (the NVIDIA device plugin's).
GPU_RESOURCE = "nvidia.com/gpu"

# A revision is the NIXL pairing key (revision.pairing_key) of a spec, and a role revision
# one role's pods within it (the key, or a replacement of that role's pods beside the
# serving ones): hex digits, in the names of its StatefulSets, PDBs and ConfigMap.
REVISION_LENGTH = 10
# The StatefulSet controller labels pods with "<statefulset>-<hash of 10>", at most 63
# characters; the longest StatefulSet is "<name>-prefill-<revision>".
MAX_CR_NAME_LENGTH = 63 - len("-prefill-") - REVISION_LENGTH - len("-") - 10

# ---------------------------------------------------------------- ports

# Rank i of a pod is reached on SERVING_BASE_PORT + i: prefill's vLLM directly, decode's
# through the routing sidecar, which forwards to the decode vLLM rank on
# DECODE_ENGINE_BASE_PORT + i.
SERVING_BASE_PORT = 8000
PREFILL_ENGINE_BASE_PORT = SERVING_BASE_PORT
DECODE_ENGINE_BASE_PORT = 8200
ENGINE_BASE_PORTS = {"prefill": PREFILL_ENGINE_BASE_PORT, "decode": DECODE_ENGINE_BASE_PORT}
# vLLM's default data-parallel RPC port, written out so every pod of a group agrees.
DP_RPC_PORT = 29550
# The NIXL side channel's default base port (spec.kvTransfer.sideChannelPort); rank i
# listens on base + i.
NIXL_SIDE_CHANNEL_PORT = 5600
# Endpoint picker ports (the upstream picker's defaults, set explicitly).
PICKER_GRPC_PORT = 9002
PICKER_HEALTH_PORT = 9003
PICKER_METRICS_PORT = 9090
# vllm-router's client port and its Prometheus exporter.
VLLM_ROUTER_PORT = 8080
VLLM_ROUTER_METRICS_PORT = 29000
# The client-facing endpoint (answers continued across engine faults): its OpenAI API, its
# /health and its /metrics, on one port.
ENDPOINT_PORT = 8090
# An InferencePool lists at most this many target ports.
MAX_POOL_TARGET_PORTS = 8

# ---------------------------------------------------------------- addresses

# Where the servers of an engine pod listen, so that every client finds them. vLLM is given
# no --host: its default binds every address of the pod's network namespace, where
# vllm-router and the picker dial the pod IP and llm-d's routing sidecar dials loopback
# (SIDECAR_MODEL_SERVER_HOST, which it has no flag to change). The NIXL side channel binds
# and advertises the pod IP (ENV_NIXL_HOST), which the other role's engines dial.
# docs/router.md lists every dial, read from the rendering.
SIDECAR_MODEL_SERVER_HOST = "localhost"

# ---------------------------------------------------------------- environment and paths

ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_POD_IP = "POD_IP"
# The NIXL handshake listener binds and advertises this host (the pod IP).
ENV_NIXL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
ENV_NIXL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
# The vLLM version the engine runs, compared between prefill and decode.
ENV_VLLM_VERSION = "LONGCTX_VLLM_VERSION"
# Read by the engine's vLLM plugin (longctx_engine/vllm_plugin.py).
ENV_NIXL_PROGRESS_DELAY_US = "LONGCTX_NIXL_PROGRESS_DELAY_US"
# vllm-cpu: the cores of an engine's OpenMP threads (spec.engine.cpu.threadsBind).
ENV_CPU_THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
ENV_HF_TOKEN = "HF_TOKEN"
# The Downward API fields every engine pod exposes, by env key.
DOWNWARD_ENV = ((ENV_POD_NAME, "metadata.name"), (ENV_POD_NAMESPACE, "metadata.namespace"),
                (ENV_POD_IP, "status.podIP"), (ENV_NIXL_HOST, "status.podIP"))

ENGINE_CONTAINER = "engine"
ENGINE_CONTAINER_COMMAND = ("longctx-engine", "run")
CONFIG_DIR = "/etc/longctx"


def launch_key(role: str) -> str:
    """The engine ConfigMap's key of a role's launch document (launch.py)."""
    return f"{role}.json"


def launch_path(role: str) -> str:
    return f"{CONFIG_DIR}/{launch_key(role)}"


MODEL_MOUNT = "/models"                # where a PVC model source is mounted
MODEL_LINK_DIR = "/tmp/longctx-model"  # see recipes.EngineCommand.workdir
# The vLLM image defines no user and runs as any uid once HOME (the HF, Triton, NVRTC and
# vLLM caches) is writable: an emptyDir at ENGINE_HOME.
ENGINE_UID = 65532
ENGINE_HOME = "/home/longctx"

# ---------------------------------------------------------------- labels and annotations

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
ROLE_LABEL = "llm-d.ai/role"
SERVING_LABEL = "llm-d.ai/inference-serving"
# Serving pods' revision: their NIXL pairing key (revision.pairing_key); the InferencePool
# and vllm-router select on it, so they serve every role revision of the key at once.
PAIRING_LABEL = "longctx.dev/pairing"
# A role's pods within a pairing key: the key itself, or a replacement of that role's pods
# brought up beside the serving ones (controller/replacement.py); in the StatefulSet's name
# and selector.
ROLE_REVISION_LABEL = "longctx.dev/revision"
# On an engine StatefulSet: a digest of the pod template the operator rendered for it (a
# template that differs from it drifted; a new digest is a change of the spec or rendering).
TEMPLATE_DIGEST_ANNOTATION = "longctx.dev/template-digest"
# The StatefulSet controller's label of a pod's ordinal.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
ENGINE_CONFIG_ANNOTATION = "longctx.dev/engine-config"
PICKER_CONFIG_ANNOTATION = "longctx.dev/picker-config-sha256"
# The ports a pod serves; the picker makes endpoints only for these. The legacy key is
# the one upstream pickers read; llm-d's picker reads it when the new one is absent.
ACTIVE_PORTS_ANNOTATION = "llm-d.ai/active-ports"
LEGACY_ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
ROUTER_COMPONENT = "router"
ENDPOINT_COMPONENT = "endpoint"
MONITORING_COMPONENT = "monitoring"
ENGINE_CONFIG_COMPONENT = "engine"


def selector_labels(cr_name: str, component: str | None = None,
                    revision: str | None = None, role_revision: str | None = None
                    ) -> dict[str, str]:
    """Labels that select a CR's objects (with a component, one role's pods; with a
    revision, only that pairing key's; with a role revision, only that StatefulSet's)."""
    labels = {NAME_LABEL: "longctx", INSTANCE_LABEL: cr_name}
    if component:
        labels[COMPONENT_LABEL] = component
    if revision:
        labels[PAIRING_LABEL] = revision
    if role_revision:
        labels[ROLE_REVISION_LABEL] = role_revision
    return labels


def labels(cr_name: str, component: str, pairing: str | None = None,
           role_revision: str | None = None) -> dict[str, str]:
    """Labels every child carries; engine pods add the llm-d role labels, their pairing key
    and their role revision."""
    out = {**selector_labels(cr_name, component), MANAGED_BY_LABEL: FIELD_MANAGER}
    if component in ROLES:
        out[ROLE_LABEL] = component
        out[SERVING_LABEL] = "true"
    if pairing:
        out[PAIRING_LABEL] = pairing
    if role_revision:
        out[ROLE_REVISION_LABEL] = role_revision
    return out


def serving_selector(cr_name: str, pairing: str | None = None) -> dict[str, str]:
    """Selects the serving pods of a CR, prefill and decode; with a pairing key, only those
    whose engines can hand KV to each other (the InferencePool's selector)."""
    out = {INSTANCE_LABEL: cr_name, SERVING_LABEL: "true"}
    if pairing:
        out[PAIRING_LABEL] = pairing
    return out


def owner_reference(cr: dict[str, Any]) -> dict[str, Any]:
    meta = cr["metadata"]
    return {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


# ---------------------------------------------------------------- names


def statefulset(cr_name: str, role: str, revision: str) -> str:
    return f"{cr_name}-{role}-{revision}"


def headless_service(cr_name: str, role: str) -> str:
    """The role's headless Service, shared by its revisions: pod i of a revision is
    `<statefulset>-i.<service>`."""
    return f"{cr_name}-{role}"


def pod(statefulset_name: str, ordinal: int) -> str:
    return f"{statefulset_name}-{ordinal}"


def pod_dns(pod_name: str, cr_name: str, role: str, namespace: str) -> str:
    return f"{pod_name}.{headless_service(cr_name, role)}.{namespace}.svc"


def engine_configmap(cr_name: str, revision: str) -> str:
    return f"{cr_name}-engine-{revision}"


def pdb(cr_name: str, role: str, revision: str) -> str:
    return statefulset(cr_name, role, revision)


def picker(cr_name: str) -> str:
    """Deployment, Service, ConfigMap, ServiceAccount, Role, RoleBinding and PodMonitor of the
    picker."""
    return f"{cr_name}-epp"


def vllm_router(cr_name: str) -> str:
    """Deployment, Service, ServiceAccount, Role, RoleBinding and PodMonitor of vllm-router."""
    return f"{cr_name}-router"


def endpoint(cr_name: str) -> str:
    """Deployment, Service, PodDisruptionBudget, ServiceAccount, Role and RoleBinding of the
    client-facing endpoint."""
    return f"{cr_name}-endpoint"


def inference_pool(cr_name: str) -> str:
    return cr_name


def http_route(cr_name: str) -> str:
    return cr_name


def pod_monitor(cr_name: str) -> str:
    return cr_name


def network_policy(cr_name: str) -> str:
    return f"{cr_name}-engines"


def capacity_rule(cr_name: str) -> str:
    """The PrometheusRule recording the decode capacity signal."""
    return f"{cr_name}-capacity"


def autoscaler(cr_name: str) -> str:
    """The HorizontalPodAutoscaler or KEDA ScaledObject on the CR's /scale."""
    return cr_name
