"""Each role's launch document, rendered once per reconcile and carried on the plan: the
pair checks, the engine ConfigMap, the pod template's digest and the replacement's
template comparison all read the same document."""

from __future__ import annotations

import dataclasses
from typing import Any

from longctx_core.launch import LaunchDocument
from longctx_core.plan.roles import RolePlan, ServingPlan
from longctx_core.vllm_config.recipes import launch_document


def rendered(cr: dict[str, Any], plan: ServingPlan) -> ServingPlan:
    """The plan with each role's launch document for the CR rendered into it."""
    meta = cr["metadata"]
    return dataclasses.replace(plan, **{role.role: dataclasses.replace(
        role, document=launch_document(role, meta["name"], meta["namespace"]))
        for role in plan.roles})


def document(cr: dict[str, Any], role: RolePlan) -> LaunchDocument:
    """The role's launch document: the one rendered into the plan, else rendered now (a
    plan built outside a reconcile, as `longctx render` and the tests build it)."""
    if role.document is not None:
        return role.document
    return launch_document(role, cr["metadata"]["name"], cr["metadata"]["namespace"])
