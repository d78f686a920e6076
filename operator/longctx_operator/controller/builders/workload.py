"""What the Deployments of a CR's own pods (the picker, vllm-router, the endpoint) share: the
ServiceAccount they run under with its Role and RoleBinding, and a ClusterIP Service, named
and labelled by their `meta`."""

from __future__ import annotations

from typing import Any

NONROOT_UID = 65532  # the llm-d images' user (Dockerfile.epp, Dockerfile.sidecar), and ours


def nonroot_pod_security(fs_group: bool = False) -> dict[str, Any]:
    """The pod's securityContext: a non-root user and group, RuntimeDefault seccomp; with
    `fs_group`, mounted volumes owned by that group."""
    out: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": NONROOT_UID,
                           "runAsGroup": NONROOT_UID}
    if fs_group:
        out["fsGroup"] = NONROOT_UID
    out["seccompProfile"] = {"type": "RuntimeDefault"}
    return out


def restricted_container_security(read_only_root: bool = True, own_user: bool = False
                                  ) -> dict[str, Any]:
    """A container's securityContext under the restricted Pod Security Standard; vllm-router
    writes to its root filesystem (`read_only_root=False`); llm-d's containers name their
    user and seccomp profile themselves (`own_user`), as llm-d's own manifests do."""
    out: dict[str, Any] = {"allowPrivilegeEscalation": False}
    if read_only_root:
        out["readOnlyRootFilesystem"] = True
    out["capabilities"] = {"drop": ["ALL"]}
    if own_user:
        out.update(nonroot_pod_security())
    return out


def service_account_objects(meta: dict[str, Any], rules: list[dict[str, Any]]
                            ) -> list[dict[str, Any]]:
    """A ServiceAccount allowed `rules` in its namespace (all three objects share `meta`)."""
    name, namespace = meta["name"], meta["namespace"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
         "automountServiceAccountToken": True},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def cluster_ip_service(meta: dict[str, Any], selector: dict[str, str], port: int,
                       port_name: str) -> dict[str, Any]:
    """A Service of one TCP port, forwarded to the pods' port of that name."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": port_name, "port": port, "targetPort": port_name,
                                "protocol": "TCP"}]}}
