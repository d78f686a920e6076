"""The kinds of objects the operator reads and writes, and what it may do with each: the
source of its RBAC rules (rbac.py), its watch caches (runtime/cache.py) and its clean-up."""

from __future__ import annotations

from dataclasses import dataclass

from longctx_core.contract import API_VERSION, FIELD_MANAGER, KIND, MANAGED_BY_LABEL, PLURAL


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
    # Whether a reconcile reads its status (a workload's readiness): if not, a change of
    # only its status, which another controller writes, asks for no reconcile.
    status_read: bool = True
    cluster_scoped: bool = False
    # A reconcile applies its children in waves, each wave's objects at once: workloads
    # after what their pods refer to (a pod whose ServiceAccount does not exist yet is
    # refused), a RoleBinding after its Role (the API server reads the Role to check that
    # the operator may grant it).
    wave: int = 0

    @property
    def watch_labels(self) -> dict[str, str]:
        """What selects the objects the operator watches: its children carry the managed-by
        label."""
        if not (self.managed or self.watched):
            return {}
        return {MANAGED_BY_LABEL: FIELD_MANAGER}

    @property
    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.watch_labels.items())

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
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", managed=True, watched=True,
         status_read=False),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", managed=True, watched=True),
    Kind("apps/v1", "Deployment", "deployments", managed=True, watched=True, wave=1),
    Kind("v1", "ServiceAccount", "serviceaccounts", managed=True, watched=True),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles", managed=True, watched=True),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", managed=True,
         watched=True, wave=1),
    Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools", managed=True,
         watched=True, status_read=False),
    Kind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", managed=True,
         crd="httproutes.gateway.networking.k8s.io"),
    Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors", managed=True,
         crd="podmonitors.monitoring.coreos.com"),
    Kind("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules", managed=True,
         crd="prometheusrules.monitoring.coreos.com"),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", managed=True,
         watched=True, status_read=False),
    Kind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", managed=True,
         crd="scaledobjects.keda.sh"),
    # Pods are never created or deleted by the operator; a pod leaving on scale-down gets
    # its serving label turned off (a metadata patch) so that the pool stops selecting it.
    # Every pod of a CR's workloads is cached: the engines', the routers' (a rollout waits
    # for an old router pod to end) and the endpoint's (the engine watch reads its
    # counters); only an engine pod's change asks for a reconcile (runtime/main.py).
    Kind("v1", "Pod", "pods", watched=True, verbs=("get", "list", "watch", "patch")),
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
