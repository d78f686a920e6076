"""Names and labels of every child object of one LongContextDeployment."""

from __future__ import annotations

from typing import Any

from longctx_engine import api

FIELD_MANAGER = "longctx-operator"
# Serving pods' NIXL pairing key (longctx_engine.compat.pairing_key); the pool selects on it.
PAIRING_LABEL = "longctx.dev/pairing"
ROLES = ("prefill", "decode")


def statefulset(cr_name: str, role: str) -> str:
    return f"{cr_name}-{role}"


def headless_service(cr_name: str, role: str) -> str:
    return f"{cr_name}-{role}"


def engine_configmap(cr_name: str) -> str:
    return f"{cr_name}-engine"


def pdb(cr_name: str, role: str) -> str:
    return f"{cr_name}-{role}"


def picker(cr_name: str) -> str:
    """Deployment, Service, ConfigMap, ServiceAccount, Role and RoleBinding of the picker."""
    return f"{cr_name}-epp"


def inference_pool(cr_name: str) -> str:
    return cr_name


def http_route(cr_name: str) -> str:
    return cr_name


def selector_labels(cr_name: str, component: str | None = None) -> dict[str, str]:
    """Labels that select a CR's objects (and, with a component, one role's pods)."""
    labels = {"app.kubernetes.io/name": "longctx", "app.kubernetes.io/instance": cr_name}
    if component:
        labels["app.kubernetes.io/component"] = component
    return labels


def labels(cr_name: str, component: str, pairing: str | None = None) -> dict[str, str]:
    """Labels every child carries; engine pods add the llm-d role labels and their pairing key."""
    out = {**selector_labels(cr_name, component), "app.kubernetes.io/managed-by": FIELD_MANAGER}
    if component in ROLES:
        out["llm-d.ai/role"] = component
        out["llm-d.ai/inference-serving"] = "true"
    if pairing:
        out[PAIRING_LABEL] = pairing
    return out


def serving_selector(cr_name: str, pairing: str | None = None) -> dict[str, str]:
    """Selects the serving pods of a CR, prefill and decode; with a pairing key, only those
    whose engines can hand KV to each other (the InferencePool's selector)."""
    out = {"app.kubernetes.io/instance": cr_name, "llm-d.ai/inference-serving": "true"}
    if pairing:
        out[PAIRING_LABEL] = pairing
    return out


def owner_reference(cr: dict[str, Any]) -> dict[str, Any]:
    meta = cr["metadata"]
    return {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
