"""Which role revisions a spec runs: a role's only pod is replaced beside the serving one,
never restarted in place, and only that role's.

A spec's revision is its NIXL pairing key (revision.pairing_key): a change of the key rolls
both roles to a new revision (rollout.py's Surge or Recreate). Within one key each role's
pods belong to a *role revision* (its StatefulSet): the key itself, or a replacement of
that role's pods. A change that keeps the key rolls in place: each StatefulSet's rolling
update restarts its pods one at a time, which keeps a role of two or more pods serving. A
role of one pod would serve nothing while its new pod loads (tens of minutes on H200s), so
under `spec.rollout.strategy: Surge` this module gives that role alone a new role revision
instead: its new pods come up beside the serving ones, the router (which selects the
pairing key) serves old and new together, then the old pods leave the pool, drain and go
(`swap_step`). The other role keeps its pods. Two things make a single-pod role restart:
- its pod template changes (a spec edit of that role, or an operator that renders it
  differently);
- its pod sits on a node being drained (cordoned): the pod's PodDisruptionBudget refuses
  the eviction (builders/engine.max_unavailable) until its replacement serves from another
  node and the old role revision is removed.

A replacement's name is a digest of the pairing key and of what it replaces, so every
reconcile of the same situation names the same role revision; once it serves, its
template matches the spec and nothing more is replaced.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from longctx_core import contract
from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller import rollout
from longctx_operator.controller.builders.engine import statefulset
from longctx_operator.controller.drift import matches
from longctx_operator.controller.rollout import Revision, role_revision_of
from longctx_operator.controller.routers import Router

# Names the role revision in templates whose digest names a replacement.
_PLACEHOLDER = "0" * contract.REVISION_LENGTH


@dataclass(frozen=True)
class Replacement:
    """A replacement role revision and why each of its roles is replaced."""

    revision: str
    reasons: tuple[str, ...]
    changed: tuple[str, ...]    # the roles whose pod template changes
    roles: tuple[str, ...]      # the roles replaced

    def describe(self) -> str:
        kept = [r for r in contract.ROLES if r not in self.roles]
        keeps = f"; {' and '.join(kept)} keeps its pods" if kept else ""
        return (f"{'; '.join(self.reasons)}: its new pods (role revision {self.revision}) "
                f"come up beside the serving ones and take over when Ready, instead of a "
                f"restart in place{keeps}")


def changes_template(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether applying the desired StatefulSet would change its pod template because what
    the operator renders changed (a live template edited by hand is drift, repaired in
    place: its digest still matches what was rendered)."""
    digest = (live["metadata"].get("annotations") or {}).get(contract.TEMPLATE_DIGEST_ANNOTATION)
    if digest is not None:
        return digest != desired["metadata"]["annotations"][contract.TEMPLATE_DIGEST_ANNOTATION]
    return not matches(desired["spec"]["template"], live["spec"]["template"])


def _rendered(cr: dict[str, Any], plan: ServingPlan, role: str, revision: str,
              router: Router) -> dict[str, Any]:
    return statefulset(cr, plan.with_role_revisions({role: revision}).role(role), router)


def plan_for_revision(cr: dict[str, Any], plan: ServingPlan, router: Router,
                      live: Optional[Revision], serves: bool, cordoned_nodes: set[str]
                      ) -> tuple[ServingPlan, Optional[Replacement]]:
    """The plan with each role named for the role revision its objects belong to. `live`:
    the plan's revision (pairing key) as it runs, if it does; `serves`: whether the router
    sends requests to it. A role keeps the newest of its StatefulSets whose template the
    plan renders (an in-place edit rolls the newest); a single-pod role under Surge whose
    template changes, or whose pod is on a cordoned node, gets a replacement instead."""
    names: dict[str, str] = {}
    reasons: list[str] = []
    changed: list[str] = []
    replaced: list[str] = []
    moved: set[str] = set()
    beside = serves and plan.spec.rollout.strategy == "Surge"
    for role in plan.roles:
        sets = live.role_sets(role.role) if live is not None else []
        if not sets:
            continue   # a new role revision: named for the key
        newest = sets[-1]
        chosen = next((s for s in reversed(sets) if not changes_template(
            _rendered(cr, plan, role.role, role_revision_of(s) or "", router), s)), None)
        live_replicas = (newest.get("spec") or {}).get("replicas", role.replicas)
        single = beside and min(live_replicas, role.replicas) < 2
        nodes = sorted({p["spec"].get("nodeName") for p in live.set_pods(chosen)
                        if (p.get("spec") or {}).get("nodeName") in cordoned_nodes}
                       ) if chosen is not None and single else []
        if chosen is not None and not nodes:
            names[role.role] = role_revision_of(chosen) or role.revision
            continue
        if not single:
            names[role.role] = role_revision_of(newest) or role.revision   # in place
            continue
        field = f"spec.{role.role}.replicas = {role.replicas}"
        if chosen is None:
            reasons.append(f"{role.role} has one pod ({field}) and its pod template changes")
            changed.append(role.role)
        else:
            reasons.append(f"{role.role} has one pod ({field}) on node {', '.join(nodes)}, "
                           "which is being drained")
        replaced.append(role.role)
        moved.update(nodes)
    if not replaced:
        return plan.with_role_revisions(names), None
    templates = {role: _rendered(cr, plan, role, _PLACEHOLDER, router)["spec"]["template"]
                 for role in replaced}
    digest = hashlib.sha256(json.dumps(
        {"pairingKey": plan.pairing_key, "templates": templates, "movedFrom": sorted(moved)},
        sort_keys=True).encode()).hexdigest()[:contract.REVISION_LENGTH]
    names.update(dict.fromkeys(replaced, digest))
    return plan.with_role_revisions(names), Replacement(digest, tuple(reasons), tuple(changed),
                                                        tuple(replaced))


@dataclass(frozen=True)
class RoleSwap:
    """The role revisions of the serving revision being replaced: the desired one of each
    replaced role (`new`), those that served before it (`old`) and those a later edit
    superseded before any of their pods was Ready (`superseded`, removed at once), each as
    a Revision of those roles."""

    roles: tuple[str, ...]
    new: Revision
    old: Revision
    superseded: Optional[Revision] = None

    @property
    def leaving(self) -> list[dict[str, Any]]:
        """The old pods still in the router's pool."""
        return [p for p in self.old.pods if not _marked(p)]

    @property
    def switched(self) -> bool:
        """Whether the old pods have left the pool (the cluster says so: their marks)."""
        return not self.leaving

    def retired(self, cr_name: str, deleted: list[str]) -> set[str]:
        """The objects (StatefulSets, PDBs, ConfigMaps) of the role revisions among
        `deleted`."""
        sets = [s for r in (self.old, self.superseded) if r is not None and r.name in deleted
                for s in r.sets]
        return {s["metadata"]["name"] for s in sets} | {
            contract.engine_configmap(cr_name, role_revision_of(s) or "") for s in sets}


def _marked(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp") or (
        pod["metadata"].get("annotations") or {}).get(rollout.DRAINING_ANNOTATION))


def role_swap(plan: ServingPlan, live: Optional[Revision]) -> Optional[RoleSwap]:
    """The swap under way in the serving revision `live`: roles with a StatefulSet of a role
    revision other than the plan's (None when there is none)."""
    if live is None:
        return None
    want = plan.role_revisions
    roles = tuple(r for r in contract.ROLES
                  if any(role_revision_of(s) != want[r] for s in live.role_sets(r)))
    if not roles:
        return None
    new_sets = {r: s for r in roles for s in live.role_sets(r) if role_revision_of(s) == want[r]}
    old_sets: list[dict[str, Any]] = []
    superseded: list[dict[str, Any]] = []
    for r in roles:
        others = [s for s in live.role_sets(r) if role_revision_of(s) != want[r]]
        # The oldest served; a later one none of whose pods got Ready never did.
        old_sets += [s for i, s in enumerate(others)
                     if i == 0 or (s.get("status") or {}).get("readyReplicas")]
        superseded += [s for s in others if s not in old_sets]

    def grouped(sets: list[dict[str, Any]]) -> Revision:
        first: dict[str, dict[str, Any]] = {}
        for s in sets:
            first.setdefault(s["metadata"]["labels"][contract.COMPONENT_LABEL], s)
        return Revision("/".join(dict.fromkeys(role_revision_of(s) or "" for s in sets)),
                        first, [p for s in sets for p in live.set_pods(s)], tuple(sets))
    new = grouped(list(new_sets.values()))
    new = Revision("/".join(dict.fromkeys(want[r] for r in roles)), new.statefulsets,
                   new.pods, new.sets)
    return RoleSwap(roles, new, grouped(old_sets),
                    grouped(superseded) if superseded else None)


def swap_step(swap: RoleSwap, revision_step: rollout.Step, policy: rollout.Policy,
              previous: dict[str, Any], now: datetime.datetime, load: rollout.DrainLoad,
              capacity_shortage: Callable[[], Optional[str]],
              replaced: Optional[Replacement], cost: Optional[rollout.Cost], cr_name: str
              ) -> rollout.Step:
    """The step of a role swap within the serving revision, whose own step is
    `revision_step`: rollout.step over the replaced roles' role revisions (the other role
    needs no Ready pod of its own: it keeps serving). It takes the revision step's place in
    status.rollout; both post their events, and the revision keeps serving."""
    role_policy = dataclasses.replace(
        policy, scope=f"{' and '.join(swap.roles)} role revision",
        min_ready={r: policy.min_ready[r] if r in swap.roles else 0 for r in contract.ROLES})
    desired = swap.new.name
    why = replaced.describe() if replaced is not None else (
        previous.get("reason") if previous.get("to") == desired else None)
    revisions = {r.name: r for r in (swap.old, swap.superseded, swap.new) if r is not None}
    step = rollout.step(desired=desired, serving=desired if swap.switched else swap.old.name,
                        revisions=revisions, previous=previous, policy=role_policy, now=now,
                        load=load, capacity_shortage=capacity_shortage, why=why, cost=cost)
    step.status["roles"] = list(swap.roles)
    step.retire = swap.retired(cr_name, step.delete)
    if step.serving == desired:
        step.leave_pool = [p["metadata"]["name"] for p in swap.leaving]
    step.serving, step.delete = revision_step.serving, revision_step.delete
    step.apply_desired = revision_step.apply_desired
    step.events = revision_step.events + step.events
    if revision_step.wake_after is not None:
        step.wake_after = min(revision_step.wake_after,
                              step.wake_after or revision_step.wake_after)
    return step
