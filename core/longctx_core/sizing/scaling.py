"""How many pods each role runs, in P/D units (pure).

A unit is spec.scaling.prefillPerUnit prefill pods and decodePerUnit decode pods. The
count of each role comes from exactly one source, so the operator and an autoscaler never
write the same thing:
- spec.replicas set (by the user, `kubectl scale` or an autoscaler through /scale): the
  units; the per-role replicas fields are ignored;
- else the per-role replicas fields, each defaulting to one unit's share.
An autoscaler writes only spec.replicas (the rules refuse spec.autoscaling beside explicit
per-role replicas); the operator never writes the spec.
"""

from __future__ import annotations

from typing import Any, Iterable

from longctx_core import contract
from longctx_core.api.spec import LongContextDeploymentSpec


def per_unit(spec: LongContextDeploymentSpec, role: str) -> int:
    scaling = spec.scaling
    return scaling.prefillPerUnit if role == "prefill" else scaling.decodePerUnit


def role_replicas(spec: LongContextDeploymentSpec, role: str) -> int:
    """Pods of one role (layout.role_layout reads it; every builder follows the layout)."""
    if spec.replicas is not None:
        return spec.replicas * per_unit(spec, role)
    explicit = getattr(spec, role).replicas
    return explicit if explicit is not None else per_unit(spec, role)


def units(spec: LongContextDeploymentSpec) -> int:
    """The units the spec asks for: spec.replicas, or the complete units its per-role
    replicas make."""
    if spec.replicas is not None:
        return spec.replicas
    return min(role_replicas(spec, role) // max(per_unit(spec, role), 1)
               for role in contract.ROLES)


def _live(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and pod.get("status", {}).get(
        "phase") not in ("Succeeded", "Failed")


def observed_units(spec: LongContextDeploymentSpec, pods: Iterable[dict[str, Any]]) -> int:
    """Complete units among the CR's live pods, at most the units asked for (a rollout's
    second revision does not count twice)."""
    counts = dict.fromkeys(contract.ROLES, 0)
    for pod in pods:
        role = pod["metadata"].get("labels", {}).get(contract.COMPONENT_LABEL)
        if role in counts and _live(pod):
            counts[role] += 1
    complete = min(counts[role] // max(per_unit(spec, role), 1) for role in contract.ROLES)
    return min(complete, units(spec))


def scale_status(cr_name: str, spec: LongContextDeploymentSpec | None,
                 pods: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What the CR's /scale subresource reads: status.replicas (units running) and
    status.selector (the serving pods of the CR, as a label selector string)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(contract.serving_selector(cr_name).items()))
    return {"replicas": observed_units(spec, pods) if spec is not None else 0,
            "selector": selector}
