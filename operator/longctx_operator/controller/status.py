"""The CR's status from what its children report (pure)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from longctx_core import contract

from longctx_operator.controller.pods import crash_message, unschedulable_message

if TYPE_CHECKING:
    from longctx_operator.controller.rollout import Step


@dataclass(frozen=True)
class Refusal:
    """Why the current spec is not rolled out; the last accepted children keep running."""

    condition: str  # the condition set False: CapacityPlanned or Accepted
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """The children as the API reports them."""

    statefulsets: dict[str, dict[str, Any] | None]  # role -> StatefulSet
    pods: list[dict[str, Any]]
    router: tuple[bool, str, str] | None  # (ready, reason, message); None: no router


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason,
            "message": message}


def _role_status(sts: dict[str, Any] | None, desired: int) -> dict[str, Any]:
    st = (sts or {}).get("status", {})
    ready = st.get("readyReplicas", 0)
    return {"replicas": desired, "readyReplicas": ready,
            "updatedReplicas": st.get("updatedReplicas", 0), "summary": f"{ready}/{desired}"}


def _role_condition(role: str, sts: dict[str, Any] | None, desired: int,
                    pods: list[dict[str, Any]]) -> dict[str, Any]:
    type_ = f"{role.capitalize()}Ready"
    if sts is None:
        return _condition(type_, False, "NotCreated", f"StatefulSet of {role} does not exist yet")
    st = sts.get("status", {})
    pods = [p for p in pods
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == role]
    crash = crash_message(pods)
    if crash:
        return _condition(type_, False, "CrashLoop", crash)
    pending = unschedulable_message(pods)
    if pending:
        return _condition(type_, False, "Unschedulable", pending)
    if st.get("observedGeneration", 0) < sts["metadata"].get("generation", 0):
        return _condition(type_, False, "RollingOut", "the StatefulSet controller has not yet "
                          "seen the latest template")
    ready, updated = st.get("readyReplicas", 0), st.get("updatedReplicas", 0)
    if ready >= desired and updated >= desired:
        return _condition(type_, True, "AllReady", f"{ready}/{desired} pods ready")
    return _condition(type_, False, "PodsNotReady",
                      f"{ready}/{desired} pods ready, {updated}/{desired} updated")


def compute_status(cr: dict[str, Any], *, refusal: Refusal | None, plan: dict[str, Any] | None,
                   observed: Observed, desired_replicas: dict[str, int], endpoint: str | None,
                   previous: dict[str, Any] | None, rollout: "Step | None" = None,
                   data_path: dict[str, str] | None = None) -> dict[str, Any]:
    """The full status. `observed` holds the serving revision's StatefulSets and pods;
    `rollout`, what this reconcile did about revisions; `data_path`, the DataPathHealthy
    condition (data_path.condition). Condition timestamps move only when a condition's
    status changes."""
    generation = cr["metadata"].get("generation", 1)
    conditions: list[dict[str, Any]] = []
    if refusal:
        conditions.append(_condition(refusal.condition, False, refusal.reason, refusal.message))
    if plan is not None and not (refusal and refusal.condition == "CapacityPlanned"):
        conditions.insert(0, _condition("CapacityPlanned", True, "Fits",
                                        "the layout holds maxContextTokens"))
    role_conditions = [_role_condition(role, observed.statefulsets.get(role),
                                       desired_replicas.get(role, 0), observed.pods)
                       for role in contract.ROLES]
    conditions += role_conditions
    if observed.router is not None:
        ok, reason, message = observed.router
        conditions.append(_condition("RouterReady", ok, reason, message))
    crashes = [c for c in role_conditions if c["reason"] == "CrashLoop"]
    failed = rollout.failed if rollout is not None else None
    degraded = bool(crashes) or bool(failed)
    if crashes:
        conditions.append(_condition("Degraded", True, "CrashLoop", crashes[0]["message"]))
    elif failed:
        conditions.append(_condition("Degraded", True, "RolloutFailed", failed))
    else:
        conditions.append(_condition("Degraded", False, "NoCrashes", "no engine is restarting"))
    if rollout is not None:
        blocked = rollout.blocked
        conditions.append(_condition("RolloutBlocked", bool(blocked),
                                     "InsufficientGPUs" if blocked else "Schedulable",
                                     blocked or "the new revision's pods can be placed"))
    if data_path is not None:
        conditions.append(_condition(data_path["type"], data_path["status"] == "True",
                                     data_path["reason"], data_path["message"]))
    topology = (plan or {}).get("topology", {})
    if "satisfiable" in topology:
        conditions.append(_condition(
            "TopologySatisfiable", topology["satisfiable"],
            "DomainFits" if topology["satisfiable"] else "NoDomainFits",
            topology.get("problem") or f"a {topology['topologyKey']} domain holds a unit"))
    serving = [c for c in conditions if c["type"].endswith("Ready")]
    all_ready = all(c["status"] == "True" for c in serving)
    if refusal:
        ready = _condition("Ready", False, "SpecRefused", f"{refusal.message} The children of the "
                           "last accepted spec are left as they are.")
    elif crashes:
        ready = _condition("Ready", False, "Degraded", crashes[0]["message"])
    elif all_ready:
        ready = _condition("Ready", True, "AllReady", "prefill, decode and router are ready")
    else:
        waiting = next(c for c in serving if c["status"] != "True")
        ready = _condition("Ready", False, waiting["reason"], f"{waiting['type']}: "
                           f"{waiting['message']}")
    conditions.append(ready)
    rolling = rollout is not None and rollout.phase not in ("Steady", "Failed")
    progressing = not refusal and not degraded and (not all_ready or rolling)
    conditions.append(_condition(
        "Progressing", progressing, "RollingOut" if progressing else "Settled",
        (f"rollout {rollout.phase}: revision {rollout.status.get('to')}" if rolling
         else ready["message"]) if progressing else "nothing is rolling out"))
    phase = ("Refused" if refusal else "Degraded" if degraded else
             "Ready" if all_ready and not rolling else "Progressing")
    _carry_timestamps(conditions, (previous or {}).get("conditions", []), generation)
    status: dict[str, Any] = {
        "observedGeneration": generation, "phase": phase, "conditions": conditions,
        "prefill": _role_status(observed.statefulsets.get("prefill"),
                                desired_replicas.get("prefill", 0)),
        "decode": _role_status(observed.statefulsets.get("decode"),
                               desired_replicas.get("decode", 0)),
    }
    if plan is not None:
        status["plan"] = _without_nulls(plan)
        if refusal is None or refusal.condition != "CapacityPlanned":
            status["maxContextTokens"] = cr["spec"].get("maxContextTokens")
    if endpoint:
        status["endpoint"] = endpoint
    if rollout is not None:
        status["rollout"] = rollout.status
        status["revision"] = rollout.serving
    return status


def _without_nulls(value: Any) -> Any:
    """A merge patch deletes null keys, so a status holding them never compares equal to
    what the API server returns: drop them before writing."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _carry_timestamps(conditions: list[dict[str, Any]], previous: list[dict[str, Any]],
                      generation: int) -> None:
    before = {c["type"]: c for c in previous}
    stamp = now()
    for cond in conditions:
        old = before.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"]
        cond["lastTransitionTime"] = old.get("lastTransitionTime", stamp) if same else stamp
        cond["observedGeneration"] = generation


# Top-level status keys the operator writes only sometimes.
OPTIONAL_KEYS = ("plan", "endpoint", "maxContextTokens", "rollout", "revision", "answers")


def status_changed(previous: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether writing `new` would change anything the operator owns."""
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items()) or any(
        key in previous for key in OPTIONAL_KEYS if key not in new)


def merge_patch(previous: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns the operator's part of `previous` into `new`: keys
    that went away are written as null (a merge patch keeps what it does not name)."""
    previous = previous or {}
    patch = {key: None for key in OPTIONAL_KEYS if key in previous and key not in new}
    for key, value in new.items():
        old = previous.get(key)
        patch[key] = _nested_patch(old, value) if isinstance(old, dict) and isinstance(
            value, dict) else value
    return patch


def _nested_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        out[key] = _nested_patch(old[key], value) if isinstance(old.get(key), dict) and \
            isinstance(value, dict) else value
    return out
