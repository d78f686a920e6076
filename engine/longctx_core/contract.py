"""The pod contract: every fact that the operator's objects, the engine entrypoint, the
chart's RBAC and the tests must agree on, in one place.

Names, labels, ports, environment keys, mount paths, the roles and the table of kinds the
operator manages. Nothing else spells a port number, a child's name or a managed kind; a
change here reaches every reader. Stdlib only: the operator and the engine pod import it.
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

# A revision is the NIXL pairing key (revision.pairing_key) of a spec: hex digits, in the
# names of its StatefulSets, PDBs and ConfigMap and in every object's pairing label.
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
# An InferencePool lists at most this many target ports.
MAX_POOL_TARGET_PORTS = 8

# ---------------------------------------------------------------- environment and paths

ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_POD_IP = "POD_IP"
# The NIXL handshake listener binds and advertises this host (the pod IP).
ENV_NIXL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
ENV_NIXL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
# The vLLM version the engine runs, compared between prefill and decode.
ENV_VLLM_VERSION = "LONGCTX_VLLM_VERSION"
# Read by the engine's vLLM plugin (launcher/vllm_plugin.py).
ENV_NIXL_PROGRESS_DELAY_US = "LONGCTX_NIXL_PROGRESS_DELAY_US"
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
# Serving pods' revision: their NIXL pairing key (revision.pairing_key), or a replacement
# revision of that key; the InferencePool and vllm-router select on it.
PAIRING_LABEL = "longctx.dev/pairing"
# On a replacement revision's StatefulSets: the pairing key the revision replaces pods of.
PAIRING_KEY_ANNOTATION = "longctx.dev/pairing-key"
# The StatefulSet controller's label of a pod's ordinal.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
ENGINE_CONFIG_ANNOTATION = "longctx.dev/engine-config"
PICKER_CONFIG_ANNOTATION = "longctx.dev/picker-config-sha256"
# The ports a pod serves; the picker makes endpoints only for these. The legacy key is
# the one upstream pickers read; llm-d's picker reads it when the new one is absent.
ACTIVE_PORTS_ANNOTATION = "llm-d.ai/active-ports"
LEGACY_ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
ROUTER_COMPONENT = "router"
MONITORING_COMPONENT = "monitoring"
ENGINE_CONFIG_COMPONENT = "engine"


def selector_labels(cr_name: str, component: str | None = None,
                    revision: str | None = None) -> dict[str, str]:
    """Labels that select a CR's objects (with a component, one role's pods; with a
    revision, only that revision's)."""
    labels = {NAME_LABEL: "longctx", INSTANCE_LABEL: cr_name}
    if component:
        labels[COMPONENT_LABEL] = component
    if revision:
        labels[PAIRING_LABEL] = revision
    return labels


def labels(cr_name: str, component: str, pairing: str | None = None) -> dict[str, str]:
    """Labels every child carries; engine pods add the llm-d role labels and their pairing key."""
    out = {**selector_labels(cr_name, component), MANAGED_BY_LABEL: FIELD_MANAGER}
    if component in ROLES:
        out[ROLE_LABEL] = component
        out[SERVING_LABEL] = "true"
    if pairing:
        out[PAIRING_LABEL] = pairing
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


# ---------------------------------------------------------------- kinds


@dataclass(frozen=True)
class Kind:
    """A kind the operator reads or writes, with the access it needs."""

    api_version: str
    kind: str
    plural: str
    managed: bool = False        # created from the spec; deleted when no longer desired
    watched: bool = False        # its events trigger a reconcile of the owning CR
    crd: str | None = None       # optional kind: used only when this CRD exists
    verbs: tuple[str, ...] = ()  # what else the operator does with it (Events: create)
    status_patch: bool = False   # the operator writes its status subresource
    cluster_scoped: bool = False
    only_with_label: str | None = None   # watched only when it carries this label
    # A reconcile applies its children in waves, each wave's objects at once: workloads
    # after what their pods refer to (a pod whose ServiceAccount does not exist yet is
    # refused), a RoleBinding after its Role (the API server reads the Role to check that
    # the operator may grant it).
    wave: int = 0

    @property
    def watch_labels(self) -> dict[str, str | None]:
        """What selects the objects the operator watches: its children carry the managed-by
        label (None: the label is present, whatever its value)."""
        if not (self.managed or self.watched):
            return {}
        labels: dict[str, str | None] = {MANAGED_BY_LABEL: FIELD_MANAGER}
        if self.only_with_label:
            labels[self.only_with_label] = None
        return labels

    @property
    def label_selector(self) -> str:
        return ",".join(k if v is None else f"{k}={v}" for k, v in self.watch_labels.items())

    @property
    def cached(self) -> bool:
        """Whether the operator keeps a watch cache of it: every kind a reconcile reads,
        namely its children, the pods and the CR itself."""
        return self.managed or self.watched or self.status_patch

    @property
    def access(self) -> tuple[str, ...]:
        """The RBAC verbs the operator needs on this kind: apply (create, patch), drift
        checks (get), clean-up (list, delete), Kopf's and the caches' watches."""
        if self.verbs:
            return self.verbs
        verbs = ["get", "list"]
        if self.cached:
            verbs.append("watch")
        if self.managed:
            verbs += ["create", "patch", "delete"]
        return tuple(verbs)

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


# Children in apply-independent order; `managed` kinds are owned, `watched` ones wake the
# reconcile of their CR (Pods are watched but never written).
KINDS = (
    Kind("v1", "ConfigMap", "configmaps", managed=True, watched=True),
    Kind("v1", "Service", "services", managed=True, watched=True),
    Kind("apps/v1", "StatefulSet", "statefulsets", managed=True, watched=True, wave=1),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", managed=True, watched=True),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", managed=True, watched=True),
    Kind("apps/v1", "Deployment", "deployments", managed=True, watched=True, wave=1),
    Kind("v1", "ServiceAccount", "serviceaccounts", managed=True, watched=True),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles", managed=True, watched=True),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", managed=True,
         watched=True, wave=1),
    Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools", managed=True,
         watched=True),
    Kind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", managed=True,
         crd="httproutes.gateway.networking.k8s.io"),
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors", managed=True,
         crd="podmonitors.monitoring.coreos.com"),
    Kind("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules", managed=True,
         crd="prometheusrules.monitoring.coreos.com"),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", managed=True,
         watched=True),
    Kind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", managed=True,
         crd="scaledobjects.keda.sh"),
    # Pods are never created or deleted by the operator; a pod leaving on scale-down gets
    # its serving label turned off (a metadata patch) so that the pool stops selecting it.
    # Only engine pods (they carry the llm-d role): the picker's are read via its Deployment.
    Kind("v1", "Pod", "pods", watched=True, verbs=("get", "list", "watch", "patch"),
         only_with_label=ROLE_LABEL),
    Kind("v1", "Event", "events", verbs=("create",)),
    Kind(API_VERSION, KIND, PLURAL, status_patch=True),
    Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions",
         cluster_scoped=True),
    # Host memory and free GPUs on the nodes a placement selects; cordoned nodes (a drain).
    Kind("v1", "Node", "nodes", cluster_scoped=True, verbs=("get", "list", "watch")),
)
MANAGED_KINDS = tuple(k for k in KINDS if k.managed)
WATCHED_KINDS = tuple(k for k in KINDS if k.watched)
CACHED_KINDS = tuple(k for k in KINDS if k.cached)
KIND_BY_NAME = {k.kind: k for k in KINDS}
