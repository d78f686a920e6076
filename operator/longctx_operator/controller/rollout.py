"""Revisioned rollouts, as a pure state machine over what the cluster shows.

A revision is the NIXL pairing key of a spec (revision.pairing_key): its pods carry it in
their labels, and the router selects exactly one revision, the serving one. `step` looks at
the desired revision, the serving one, the revisions that exist and the last
`status.rollout`, and says what this reconcile must do. Everything it needs is re-read each
time, so an operator killed at any point resumes where it was. The same machine swaps one
role's pods within the serving revision, its "revisions" then being that role's role
revisions (replacement.swap_step).

    Steady ──spec changes the pairing key──▶ Progressing ──new revision Ready──▶ Draining
      ▲         (Surge)                       │  │                                │
      │                                       │  └─no GPUs──▶ Blocked            │
      │                                       └─crash/timeout──▶ Failed           │
      └──── drain window over, or the old pods idle: old revision deleted ◀───────┘
    Recreate: Steady ─▶ Recreating (old revision deleted, then the new one created) ─▶ Steady

A drain ends before its window when the router sends the draining pods nothing new and
each has held no request at two looks IDLE_CONFIRM_SECONDS apart (DrainLoad, read from the
engines by engine_load.py and passed in as data).

Reverting the spec to the serving revision deletes the pending one and touches nothing
that serves; a third edit supersedes the pending revision.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

from longctx_core import contract

from longctx_operator.controller.pods import crash_message, unschedulable_message


class Cost(Protocol):
    """What a change does, said when it starts (rollout_cost.RolloutCost)."""

    def describe(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...

# A pod is drained once idle at two looks this far apart: longer than a request's hop
# from its prefill leg to its decode leg, when both engines report nothing running.
IDLE_CONFIRM_SECONDS = 5.0
PHASES = ("Steady", "Progressing", "Blocked", "Failed", "Draining", "Recreating")
STEADY, PROGRESSING, BLOCKED, FAILED, DRAINING, RECREATING = PHASES


def _now_text(now: datetime.datetime, *, ceil: bool = False) -> str:
    """RFC 3339 in whole seconds; `ceil` rounds up, so a window measured from it is never
    shorter than asked."""
    if ceil and now.microsecond:
        now = now.replace(microsecond=0) + datetime.timedelta(seconds=1)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: Optional[str]) -> Optional[datetime.datetime]:
    if not text:
        return None
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)


def role_revision_of(obj: dict[str, Any]) -> Optional[str]:
    """The role revision a StatefulSet or pod belongs to (contract.ROLE_REVISION_LABEL)."""
    return (obj["metadata"].get("labels") or {}).get(contract.ROLE_REVISION_LABEL)


def _created(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"].get("creationTimestamp") or "", obj["metadata"]["name"]


@dataclass(frozen=True)
class Revision:
    """One revision's StatefulSets and pods, as the API reports them. A role may have more
    than one StatefulSet (role revisions, while one replaces another); `statefulsets` holds
    the one looked at for each role (the newest, or the one `focused` names)."""

    name: str
    statefulsets: dict[str, dict[str, Any]]
    pods: list[dict[str, Any]]
    sets: tuple[dict[str, Any], ...] = ()   # every StatefulSet, oldest first

    def ready(self, role: str) -> int:
        sts = self.statefulsets.get(role) or {}
        return (sts.get("status") or {}).get("readyReplicas", 0)

    def role_sets(self, role: str) -> list[dict[str, Any]]:
        """The role's StatefulSets, oldest first."""
        return [s for s in self.sets
                if s["metadata"].get("labels", {}).get(contract.COMPONENT_LABEL) == role]

    def set_pods(self, sts: dict[str, Any]) -> list[dict[str, Any]]:
        prefix = sts["metadata"]["name"] + "-"
        return [p for p in self.pods if p["metadata"]["name"].startswith(prefix)
                and p["metadata"]["name"][len(prefix):].isdigit()]

    def role_pods(self, role: str) -> list[dict[str, Any]]:
        """The pods of the role's StatefulSet looked at."""
        sts = self.statefulsets.get(role)
        if sts is not None:
            return self.set_pods(sts)
        return [] if self.role_sets(role) else [
            p for p in self.pods
            if p["metadata"].get("labels", {}).get(contract.COMPONENT_LABEL) == role]

    def focused(self, role_revisions: Mapping[str, str]) -> "Revision":
        """The same revision, looking at the StatefulSet of each role's `role_revisions`
        (a role whose named StatefulSet does not exist yet has none)."""
        chosen = {}
        for role in contract.ROLES:
            named = [s for s in self.role_sets(role)
                     if role_revision_of(s) == role_revisions.get(role)]
            if named:
                chosen[role] = named[0]
            elif role not in role_revisions and role in self.statefulsets:
                chosen[role] = self.statefulsets[role]
        return Revision(self.name, chosen, self.pods, self.sets)


def group_revisions(statefulsets: list[dict[str, Any]], pods: list[dict[str, Any]]
                    ) -> dict[str, Revision]:
    """The revisions (pairing keys) that exist, each looking at its newest StatefulSet of
    each role."""
    sets: dict[str, list[dict[str, Any]]] = {}
    for sts in sorted(statefulsets, key=_created):
        labels = sts["metadata"].get("labels", {})
        rev, role = labels.get(contract.PAIRING_LABEL), labels.get(contract.COMPONENT_LABEL)
        if rev and role in contract.ROLES:
            sets.setdefault(rev, []).append(sts)
    out = {rev: Revision(rev, {s["metadata"]["labels"][contract.COMPONENT_LABEL]: s
                               for s in found}, [], tuple(found))
           for rev, found in sets.items()}
    for pod in pods:
        rev = pod["metadata"].get("labels", {}).get(contract.PAIRING_LABEL)
        if rev:
            out.setdefault(rev, Revision(rev, {}, [])).pods.append(pod)
    return out


@dataclass
class Step:
    """What one reconcile does about revisions."""

    serving: str                       # the revision the pool selects after this step
    apply_desired: bool                # apply the desired revision's objects
    delete: list[str] = field(default_factory=list)   # revisions to remove
    status: dict[str, Any] = field(default_factory=dict)  # status.rollout
    events: list[tuple[str, str, str]] = field(default_factory=list)
    blocked: Optional[str] = None      # RolloutBlocked condition message
    failed: Optional[str] = None       # Degraded RolloutFailed message
    wake_after: Optional[float] = None  # seconds until a deadline passes with no event
    # A role swap within the revision (replacement.py): the old role revisions' objects to
    # remove, and their pods to take out of the pool.
    retire: set[str] = field(default_factory=set)
    leave_pool: list[str] = field(default_factory=list)

    @property
    def phase(self) -> str:
        return self.status["phase"]


@dataclass(frozen=True)
class DrainLoad:
    """What the draining pods hold, as looked at in this reconcile (engine_load.py)."""

    idle_seconds: Mapping[str, float] = field(default_factory=dict)  # by pod; busy: absent
    router_switched: bool = False      # the router sends the draining pods nothing new

    def drained(self, pods: list[dict[str, Any]]) -> bool:
        return self.router_switched and all(
            self.idle_seconds.get(p["metadata"]["name"], -1.0) >= IDLE_CONFIRM_SECONDS
            for p in pods)


@dataclass(frozen=True)
class Policy:
    """The spec's rollout settings, resolved."""

    strategy: str
    min_ready: dict[str, int]          # Ready pods of each role before the switch
    drain_seconds: float
    ready_timeout_seconds: float
    downtime: str                      # what Recreate costs, in words
    # What is rolled, in words: a revision (both roles), or one role's pods within it.
    scope: str = "revision"


def step(*, desired: str, serving: Optional[str], revisions: dict[str, Revision],
         previous: dict[str, Any], policy: Policy, now: datetime.datetime,
         capacity_shortage: Callable[[], Optional[str]], load: DrainLoad = DrainLoad(),
         why: Optional[str] = None, cost: Optional[Cost] = None) -> Step:
    """The rollout step (see the module docstring); `load`: the draining pods' requests;
    `why`: what makes `desired` a replacement of the serving one (replacement.py); `cost`:
    what the change does, said when it starts (rollout_cost.py)."""
    previous = previous or {}
    if serving is None or serving not in revisions:
        # Nothing serves (a new CR, or its serving revision is gone): the desired one does.
        serving = desired
    if serving == desired:
        return _settle(desired, revisions, previous, policy, now, load)
    if policy.strategy == "Recreate":
        return _recreate(desired, serving, revisions, previous, policy, now, cost)
    return _surge(desired, serving, revisions, previous, policy, now, capacity_shortage, why,
                  cost)


def _base(previous: dict[str, Any], desired: str, serving: str, policy: Policy,
          now: datetime.datetime, cost: Optional[Cost]) -> dict[str, Any]:
    same = previous.get("to") == desired
    status = {"strategy": policy.strategy, "from": previous.get("from") if same else serving,
              "to": desired, "serving": serving,
              "startTime": previous.get("startTime") if same and previous.get("startTime")
              else _now_text(now),
              "lastTransitionTime": previous.get("lastTransitionTime") or _now_text(now)}
    # What the change costs, as said when it started.
    said = previous.get("cost") if same else cost.to_json() if cost is not None else None
    if said:
        status["cost"] = said
    return status


def _started(text: str, cost: Optional[Cost]) -> str:
    return f"{text}; {cost.describe()}" if cost is not None else text


def _with_phase(status: dict[str, Any], previous: dict[str, Any], phase: str,
                now: datetime.datetime) -> dict[str, Any]:
    if previous.get("phase") != phase or previous.get("to") != status["to"]:
        status["lastTransitionTime"] = _now_text(now)
    status["phase"] = phase
    return status


def _counts(revisions: dict[str, Revision], *names: str) -> dict[str, dict[str, int]]:
    return {n: {role: revisions[n].ready(role) for role in contract.ROLES}
            for n in names if n in revisions}


def _settle(desired: str, revisions: dict[str, Revision], previous: dict[str, Any],
            policy: Policy, now: datetime.datetime, load: DrainLoad) -> Step:
    """The desired revision serves: drain and remove the others."""
    others = [r for r in revisions if r != desired]
    rolled = previous.get("to") == desired and previous.get("from") not in (None, desired)
    status = {"strategy": policy.strategy, "to": desired, "serving": desired,
              "from": previous.get("from") if rolled else None,
              "startTime": previous.get("startTime") if rolled else None,
              "switchTime": previous.get("switchTime") if rolled else None,
              "cost": previous.get("cost") if rolled else None,
              "lastTransitionTime": previous.get("lastTransitionTime") or _now_text(now)}
    status = {k: v for k, v in status.items() if v is not None}
    result = Step(serving=desired, apply_desired=True, status=status)
    # A pending revision that never served (a reverted or superseded edit) goes at once.
    never_served = [r for r in others if r == previous.get("to") and r != previous.get("serving")]
    draining = [r for r in others if r not in never_served]
    result.delete += never_served
    if policy.strategy == "Recreate" and others:
        # The old revision's pods still hold the GPUs: the new one waits until they are gone.
        result.apply_desired = False
        result.delete = others
        _with_phase(status, previous, RECREATING, now)
        status["expectedDowntime"] = policy.downtime
        return result
    if draining:
        started = _parse(previous.get("switchTime")) if rolled else None
        if started is None:
            started = now
            status["switchTime"] = _now_text(now, ceil=True)
        elapsed = (now - started).total_seconds()
        idle = load.drained([p for r in draining for p in revisions[r].pods])
        if elapsed >= policy.drain_seconds or idle:
            result.delete += draining
            how = (f"its pods held no request for {IDLE_CONFIRM_SECONDS:.0f} s, "
                   f"{max(elapsed, 0):.0f} s into the {policy.drain_seconds:.0f} s window"
                   if idle and elapsed < policy.drain_seconds
                   else f"for {policy.drain_seconds:.0f} s")
            result.events.append(("Normal", "RolloutDrained",
                                  f"{policy.scope} {', '.join(draining)} drained {how} and removed; "
                                  f"{desired} serves"))
            _with_phase(status, previous, STEADY, now)
        else:
            _with_phase(status, previous, DRAINING, now)
            until = started + datetime.timedelta(seconds=policy.drain_seconds)
            status["drainUntil"] = _now_text(until)
            # Looked at again soon: the pods may fall idle long before the window ends.
            result.wake_after = min(max((until - now).total_seconds(), 0) + 1,
                                    IDLE_CONFIRM_SECONDS)
    elif previous.get("phase") == RECREATING and not _ready(revisions.get(desired), policy):
        # Recreate's downtime lasts until the new revision serves.
        _with_phase(status, previous, RECREATING, now)
        status["expectedDowntime"] = policy.downtime
    else:
        _with_phase(status, previous, STEADY, now)
    status["readyReplicas"] = _counts(revisions, desired, *draining)
    return result


def _ready(revision: Optional[Revision], policy: Policy) -> bool:
    return revision is not None and all(revision.ready(role) >= policy.min_ready[role]
                                        for role in contract.ROLES)


def _recreate(desired: str, serving: str, revisions: dict[str, Revision],
              previous: dict[str, Any], policy: Policy, now: datetime.datetime,
              cost: Optional[Cost]) -> Step:
    status = _with_phase(_base(previous, desired, serving, policy, now, cost), previous,
                         RECREATING, now)
    status["serving"] = desired
    status["expectedDowntime"] = policy.downtime
    old = [r for r in revisions if r != desired]
    result = Step(serving=desired, apply_desired=False, delete=old, status=status)
    result.events.append(("Warning", "RolloutStarted", _started(
        f"Recreate: {policy.scope} {serving} stops now and {desired} starts when its pods "
        f"are gone; no request is served until then ({policy.downtime})", cost)))
    return result


def _surge(desired: str, serving: str, revisions: dict[str, Revision],
           previous: dict[str, Any], policy: Policy, now: datetime.datetime,
           capacity_shortage: Callable[[], Optional[str]], why: Optional[str],
           cost: Optional[Cost]) -> Step:
    status = _base(previous, desired, serving, policy, now, cost)
    result = Step(serving=serving, apply_desired=True, status=status)
    result.delete = [r for r in revisions if r not in (serving, desired)]
    if why:
        status["reason"] = why
    if previous.get("to") != desired:
        result.events.append(("Normal", "RolloutStarted", _started(
            f"Surge: {why}" if why else f"Surge: {policy.scope} {desired} comes up beside "
            f"{serving}, which serves until the new one is Ready", cost)))
    new = revisions.get(desired)
    status["readyReplicas"] = _counts(revisions, serving, desired)
    if _ready(new, policy):
        result.serving = desired
        status.update(serving=desired, **{"from": serving}, switchTime=_now_text(now, ceil=True))
        status["drainUntil"] = _now_text(now + datetime.timedelta(seconds=policy.drain_seconds))
        _with_phase(status, previous, DRAINING, now)
        result.events.append(("Normal", "RolloutSwitched",
                              f"the router now sends every request to {policy.scope} {desired}; "
                              f"{serving} drains for {policy.drain_seconds:.0f} s"))
        result.wake_after = min(policy.drain_seconds + 1, IDLE_CONFIRM_SECONDS)
        return result
    pods = new.pods if new is not None else []
    crash = crash_message(pods)
    started = _parse(status["startTime"]) or now
    if crash or (now - started).total_seconds() > policy.ready_timeout_seconds:
        result.failed = (f"{policy.scope} {desired} failed, {serving} keeps serving: " + (
            crash or f"not Ready within engine.engineReadyTimeoutSeconds "
                     f"({policy.ready_timeout_seconds:.0f} s)")
            + "; fix the spec, or revert it to return to the serving revision")
        if previous.get("phase") != FAILED or previous.get("to") != desired:
            result.events.append(("Warning", "RolloutFailed", result.failed))
        _with_phase(status, previous, FAILED, now)
        return result
    if unschedulable_message(pods):
        result.blocked = (f"{why}; " if why else "") + (
            capacity_shortage() or unschedulable_message(pods) or "") + (
            f"; {policy.scope} {serving} keeps serving, nothing is stopped. Add nodes, or set "
            "spec.rollout.strategy to Recreate to replace the serving revision in place (no "
            "serving during the load)")
        if previous.get("phase") != BLOCKED or previous.get("to") != desired:
            result.events.append(("Warning", "RolloutBlocked", result.blocked))
        _with_phase(status, previous, BLOCKED, now)
        return result
    _with_phase(status, previous, PROGRESSING, now)
    # The load's deadline passes without an event if the new pods just never get Ready.
    result.wake_after = max(policy.ready_timeout_seconds - (now - started).total_seconds(),
                            0) + 1
    return result


# ---------------------------------------------------------------- scale-down drain

DRAINING_ANNOTATION = "longctx.dev/draining-since"


@dataclass
class ScaleDown:
    """How one role of the desired revision goes down: the replicas to keep until the pods
    being removed have drained, and the pods whose pool label to set."""

    replicas: int                                    # what the StatefulSet gets now
    leave_pool: list[str] = field(default_factory=list)   # pods to take out of the pool
    rejoin_pool: list[str] = field(default_factory=list)  # pods kept after all
    wake_after: Optional[float] = None
    drained_early: list[str] = field(default_factory=list)  # removed before the window


def _ordinal(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


def leaving(desired: int, live: Optional[dict[str, Any]], pods: list[dict[str, Any]]
            ) -> list[dict[str, Any]]:
    """The pods a scale-down to `desired` removes (none when it is no scale-down)."""
    current = ((live or {}).get("spec") or {}).get("replicas", desired)
    if current <= desired:
        return []
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and _ordinal(p) >= desired]


def scale_down(desired: int, live: Optional[dict[str, Any]], pods: list[dict[str, Any]],
               drain_seconds: float, now: datetime.datetime, load: DrainLoad = DrainLoad()
               ) -> ScaleDown:
    """A StatefulSet removes its highest ordinals. Those pods first leave the pool (their
    serving label is turned off, so the router sends them nothing new) and the StatefulSet
    keeps them until they have drained for `drain_seconds`, or until `load` shows them
    idle; then it gets `desired`. A pod marked to leave that the spec keeps again rejoins
    at once; scale-up never waits."""
    current = ((live or {}).get("spec") or {}).get("replicas", desired)
    serving = {p["metadata"]["name"]: p for p in pods
               if not p["metadata"].get("deletionTimestamp")}
    removed = leaving(desired, live, pods)
    marked = {name for name, p in serving.items()
              if (p["metadata"].get("annotations") or {}).get(DRAINING_ANNOTATION)}
    result = ScaleDown(replicas=max(desired, 0))
    result.rejoin_pool = sorted(n for n in marked if _ordinal(serving[n]) < desired)
    if not removed:
        return result
    result.leave_pool = sorted(p["metadata"]["name"] for p in removed
                               if p["metadata"]["name"] not in marked)
    since = [_parse(serving[n]["metadata"]["annotations"][DRAINING_ANNOTATION])
             for n in marked if _ordinal(serving[n]) >= desired]
    if result.leave_pool or not since:
        result.replicas = current
        result.wake_after = min(drain_seconds + 1, IDLE_CONFIRM_SECONDS)
        return result
    latest = max(s for s in since if s)
    remaining = max(drain_seconds - (now - latest).total_seconds(), 0)
    if remaining > 0 and load.drained(removed):
        result.drained_early = sorted(p["metadata"]["name"] for p in removed)
    elif remaining > 0:
        result.replicas = current
        result.wake_after = min(remaining + 1, IDLE_CONFIRM_SECONDS)
    return result


def draining_marks(now: datetime.datetime, leave: bool) -> dict[str, Any]:
    """The merge patch of a pod's metadata that takes it out of the pool, or back in."""
    if leave:
        return {"labels": {contract.SERVING_LABEL: "draining"},
                "annotations": {DRAINING_ANNOTATION: _now_text(now)}}
    return {"labels": {contract.SERVING_LABEL: "true"}, "annotations": {DRAINING_ANNOTATION: None}}
