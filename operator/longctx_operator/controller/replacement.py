"""Which revision a spec rolls to when a role's only pod must not restart in place.

A spec's revision is its NIXL pairing key (revision.pairing_key). A change that keeps the key
rolls in place: each StatefulSet's rolling update restarts its pods one at a time, which keeps
a role of two or more pods serving. A role of one pod would serve nothing while its new pod
loads (tens of minutes on H200s), so under `spec.rollout.strategy: Surge` this module turns
such a change into a *replacement revision* instead: the same pairing key, a new name, its
pods brought up beside the serving ones and switched to when Ready, like any Surge
(rollout.py). Two things make a single-pod role restart:
- its pod template changes (a spec edit of that role, or an operator that renders it
  differently);
- its pod sits on a node being drained (cordoned): the pod's PodDisruptionBudget refuses
  the eviction (builders/engine.max_unavailable) until its replacement serves from another
  node and the old revision is removed.

The replacement's name is a digest of the pairing key and of what it replaces, so every
reconcile of the same situation names the same revision; once it serves, its templates
match the spec and nothing more is replaced.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from longctx_core import contract
from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller.builders.engine import statefulset
from longctx_operator.controller.drift import matches
from longctx_operator.controller.rollout import Revision
from longctx_operator.controller.routers import Router

# Names the revision in templates whose digest names a replacement.
_PLACEHOLDER = "0" * contract.REVISION_LENGTH


@dataclass(frozen=True)
class Replacement:
    """A replacement revision and why each of its roles is replaced."""

    revision: str
    reasons: tuple[str, ...]
    changed: tuple[str, ...]    # the roles whose pod template changes

    def describe(self, serving: str) -> str:
        return (f"{'; '.join(self.reasons)}: revision {self.revision} comes up beside "
                f"{serving} and takes over when Ready, instead of a restart in place")


def pairing_key_of(revision: Revision) -> str:
    """The pairing key a revision runs: a replacement's StatefulSets name it, a revision
    named by its key does not."""
    for sts in revision.statefulsets.values():
        key = (sts["metadata"].get("annotations") or {}).get(contract.PAIRING_KEY_ANNOTATION)
        if key:
            return key
    return revision.name


def changes_template(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether applying the desired StatefulSet would change its pod template because what
    the operator renders changed (a live template edited by hand is drift, repaired in
    place: its digest still matches what was rendered)."""
    digest = (live["metadata"].get("annotations") or {}).get(contract.TEMPLATE_DIGEST_ANNOTATION)
    if digest is not None:
        return digest != desired["metadata"]["annotations"][contract.TEMPLATE_DIGEST_ANNOTATION]
    return not matches(desired["spec"]["template"], live["spec"]["template"])


def cordoned(nodes: Optional[list[dict[str, Any]]]) -> set[str]:
    return {n["metadata"]["name"] for n in nodes or [] if (n.get("spec") or {}).get("unschedulable")}


def replacement(cr: dict[str, Any], plan: ServingPlan, router: Router,
                serving: Optional[Revision], cordoned_nodes: set[str]) -> Optional[Replacement]:
    """The revision that replaces the serving one's single-pod roles, or None when the
    plan's changes can roll in place (or roll to a new pairing key, a Surge of its own)."""
    if serving is None or plan.spec.rollout.strategy != "Surge" \
            or pairing_key_of(serving) != plan.pairing_key:
        return None
    in_place = plan.with_revision(serving.name)
    reasons: list[str] = []
    changed: list[str] = []
    for role in in_place.roles:
        live = serving.statefulsets.get(role.role)
        if live is None:
            continue
        live_replicas = (live.get("spec") or {}).get("replicas", role.replicas)
        if min(live_replicas, role.replicas) >= 2:
            continue   # a rolling update keeps the role serving
        field = f"spec.{role.role}.replicas = {role.replicas}"
        if changes_template(statefulset(cr, role, router), live):
            reasons.append(f"{role.role} has one pod ({field}) and its pod template changes")
            changed.append(role.role)
        nodes = sorted({p["spec"].get("nodeName") for p in serving.role_pods(role.role)
                        if (p.get("spec") or {}).get("nodeName") in cordoned_nodes})
        if nodes:
            reasons.append(f"{role.role} has one pod ({field}) on node {', '.join(nodes)}, "
                           "which is being drained")
    if not reasons:
        return None
    templates = {role.role: statefulset(cr, role, router)["spec"]["template"]
                 for role in plan.with_revision(_PLACEHOLDER).roles}
    moved = sorted({p["spec"].get("nodeName") for p in serving.pods
                    if (p.get("spec") or {}).get("nodeName") in cordoned_nodes})
    digest = hashlib.sha256(json.dumps(
        {"pairingKey": plan.pairing_key, "templates": templates, "movedFrom": moved},
        sort_keys=True).encode()).hexdigest()[:contract.REVISION_LENGTH]
    return Replacement(digest, tuple(reasons), tuple(changed))


def plan_for_revision(cr: dict[str, Any], plan: ServingPlan, router: Router,
                      serving: Optional[Revision], cordoned_nodes: set[str]
                      ) -> tuple[ServingPlan, Optional[Replacement]]:
    """The plan named for the revision its objects belong to: the serving revision when
    its pairing key is the plan's and nothing forces a replacement (in-place changes keep
    the name the revision was created under), a replacement, or the pairing key."""
    found = replacement(cr, plan, router, serving, cordoned_nodes)
    if found is not None:
        return plan.with_revision(found.revision), found
    if serving is not None and pairing_key_of(serving) == plan.pairing_key:
        return plan.with_revision(serving.name), None
    return plan, None
