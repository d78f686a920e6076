"""What the engines' launch documents tell a reconcile: whether a prefill and a decode could
pair over NIXL (before anything rolls), and whether this operator renders a running role
differently from what it runs (an operator upgrade)."""

from __future__ import annotations

import functools
from typing import Any

from longctx_core import contract
from longctx_core.vllm_config.compat import pd_compatibility
from longctx_core.launch import LaunchDocument, LaunchError, fill, parse
from longctx_core.vllm_config.recipes import EngineCommand
from longctx_core.plan.roles import ServingPlan
from longctx_core.plan.rules import RecipeError

from longctx_operator.controller.rendering import document


def check_pair(prefill: LaunchDocument, decode: LaunchDocument) -> None:
    """Refuses to pair a prefill and a decode whose engines could not complete a NIXL
    handshake. The two documents may come from different renderings: an in-place roll of
    one role pairs its new engines with the other role's running ones."""
    mismatches = _mismatches(prefill.to_json(), decode.to_json())
    if mismatches:
        raise RecipeError("prefill and decode engines are incompatible for NIXL: "
                          + "; ".join(mismatches))


# Once per pair of documents: every reconcile of an unchanged CR checks the same pair.
@functools.lru_cache(maxsize=256)
def _mismatches(prefill: str, decode: str) -> tuple[str, ...]:
    commands = [EngineCommand(**vars(fill(doc, f"{doc.deployment}-{doc.role}-0", "0.0.0.0")))
                for doc in (parse(prefill), parse(decode))]
    return tuple(pd_compatibility(*commands))


def check_in_place_pair(cr: dict[str, Any], plan: ServingPlan,
                        live: dict[str, Any] | None) -> None:
    """An in-place roll restarts only the role whose launch document changed: its new
    engines pair with the other role's running ones, which run the live documents (the
    revision's `live` engine ConfigMap)."""
    data = (live or {}).get("data") or {}
    new = {role.role: document(cr, role) for role in plan.roles}
    try:
        running = {role: parse(data[contract.launch_key(role)]) for role in contract.ROLES}
    except (KeyError, LaunchError):
        return   # a document this operator cannot read is replaced, not paired with
    if running == new:
        return   # nothing rolls in place
    check_pair(new["prefill"], running["decode"])
    check_pair(running["prefill"], new["decode"])


def rerendered(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """An engine StatefulSet whose launch document digest changed."""
    if desired["kind"] != "StatefulSet":
        return False
    key = contract.ENGINE_CONFIG_ANNOTATION

    def digest(obj: dict[str, Any]) -> str | None:
        return (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
            "annotations", {}).get(key)
    return digest(live) is not None and digest(live) != digest(desired)


def rollout_cause(rerendered_roles: list[str], applied: bool, cr: dict[str, Any],
                  previous: dict[str, Any], replaced_roles: tuple[str, ...] = ()
                  ) -> dict[str, Any] | None:
    """What started the last roll: a spec edit, or this operator's rendering (rolled in
    place, or `replaced_roles` replaced beside the serving revision)."""
    generation = cr["metadata"].get("generation")
    same_spec = previous.get("observedGeneration") == generation
    if rerendered_roles or (replaced_roles and same_spec):
        roles = sorted(set(rerendered_roles) | set(replaced_roles))
        how = ("their new pods come up beside the serving ones"
               if replaced_roles else "each role rolls in place, one pod at a time")
        return {"cause": "operator", "roles": roles, "generation": generation,
                "message": f"the operator's rendering of {' and '.join(roles)} changed "
                           f"while the spec did not change (an operator upgrade); {how}"}
    if applied and previous.get("observedGeneration") != generation:
        return {"cause": "spec", "generation": generation,
                "message": f"the spec changed (generation {generation})"}
    return previous.get("rolloutCause")
