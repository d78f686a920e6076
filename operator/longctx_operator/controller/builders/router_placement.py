"""Where a router's pods run: spec.router.placement, else the engines' nodes."""

from __future__ import annotations

from typing import Any

from longctx_core.api import spec as api


def router_placement(spec: api.LongContextDeploymentSpec) -> dict[str, Any]:
    """The nodeSelector and tolerations of a router pod (vllm-router, llm-d's picker): those
    of spec.router.placement, or of spec.placement, so that the router runs next to the
    engines (it requests no GPU, so nothing GPU-specific is required)."""
    placement = spec.router.placement or spec.placement
    out: dict[str, Any] = {}
    if placement.nodeSelector:
        out["nodeSelector"] = dict(placement.nodeSelector)
    if placement.tolerations:
        out["tolerations"] = [dict(t) for t in placement.tolerations]
    return out
