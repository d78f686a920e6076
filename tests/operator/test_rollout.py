"""The rollout state machine (rollout.step) and the scale-down drain (rollout.scale_down),
case by case: what the cluster shows and the last status.rollout in, the exact phase,
serving revision, deletions, events and wake-up out. Pure: no cluster."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from longctx_core import contract
from longctx_operator.controller import rollout
from longctx_operator.controller.rollout import (BLOCKED, DRAINING, DRAINING_ANNOTATION, FAILED,
                                      IDLE_CONFIRM_SECONDS, PROGRESSING, RECREATING, STEADY,
                                      DrainLoad, Policy)

NOW = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
DRAIN, TIMEOUT = 60.0, 600.0
LOOK = IDLE_CONFIRM_SECONDS    # a drain is looked at again this soon
SHORTAGE = "2 GPUs short on nodes with nvidia.com/gpu.product=NVIDIA-H200"


def at(seconds: float) -> str:
    return (NOW + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy(strategy: str = "Surge") -> Policy:
    return Policy(strategy=strategy, min_ready={"prefill": 1, "decode": 1},
                  drain_seconds=DRAIN, ready_timeout_seconds=TIMEOUT, downtime="about 9 min")


def labels(rev: str, role: str) -> dict[str, str]:
    return {contract.PAIRING_LABEL: rev, contract.COMPONENT_LABEL: role}


def pod(rev: str, role: str, state: str) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if state == "crash":
        status["containerStatuses"] = [{
            "name": "engine", "restartCount": 4, "state": {"waiting": {
                "reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]
    if state == "unschedulable":
        status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                 "message": "0/4 nodes have free nvidia.com/gpu"}]
    return {"metadata": {"name": f"glm-{role}-{rev}-0", "labels": labels(rev, role)},
            "status": status}


def cluster(**revisions: str) -> dict[str, rollout.Revision]:
    """Revisions by name, each "ready", "loading", "crash" or "unschedulable"."""
    stss, pods = [], []
    for rev, state in revisions.items():
        for role in contract.ROLES:
            stss.append({"metadata": {"name": f"glm-{role}-{rev}", "labels": labels(rev, role)},
                         "status": {"readyReplicas": 1 if state == "ready" else 0}})
            pods.append(pod(rev, role, state))
    return rollout.group_revisions(stss, pods)


@dataclass
class Case:
    id: str
    desired: str
    serving: Optional[str]
    revisions: dict[str, rollout.Revision]
    previous: dict[str, Any]
    phase: str
    now_serving: str
    delete: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    apply: bool = True
    wake: Optional[float] = None
    strategy: str = "Surge"
    load: DrainLoad = DrainLoad()


def idle(seconds: float, *pods: str, switched: bool = True) -> DrainLoad:
    """The draining pods named, idle for `seconds`; the router switched or not."""
    return DrainLoad({p: seconds for p in pods}, router_switched=switched)


OLD_PODS = ("glm-prefill-a-0", "glm-decode-a-0")


PROGRESS_B = {"phase": PROGRESSING, "from": "a", "to": "b", "serving": "a",
              "startTime": at(-100), "lastTransitionTime": at(-100)}
DRAIN_B = {"phase": DRAINING, "from": "a", "to": "b", "serving": "b", "startTime": at(-200),
           "switchTime": at(-30), "lastTransitionTime": at(-30)}
STEADY_A = {"phase": STEADY, "to": "a", "serving": "a", "lastTransitionTime": at(-900)}

CASES = [
    # Steady
    Case("new CR: nothing exists, the desired revision serves at once", "a", None, {},
         {}, STEADY, "a"),
    Case("steady: a template change that keeps the pairing key is the StatefulSet's own "
         "rolling update", "a", "a", cluster(a="ready"), STEADY_A, STEADY, "a"),
    Case("serving revision deleted out of band: the desired one serves", "b", "a",
         cluster(b="loading"), STEADY_A, STEADY, "b"),
    # Surge
    Case("surge starts beside the serving revision", "b", "a", cluster(a="ready"), STEADY_A,
         PROGRESSING, "a", events=["RolloutStarted"], wake=TIMEOUT + 1),
    Case("surge loading: no new event, woken at the load deadline", "b", "a",
         cluster(a="ready", b="loading"), PROGRESS_B, PROGRESSING, "a", wake=TIMEOUT - 100 + 1),
    Case("surge switches once the new revision is Ready", "b", "a",
         cluster(a="ready", b="ready"), PROGRESS_B, DRAINING, "b", events=["RolloutSwitched"],
         wake=LOOK),
    Case("surge blocked: the new pods cannot be scheduled", "b", "a",
         cluster(a="ready", b="unschedulable"), PROGRESS_B, BLOCKED, "a",
         events=["RolloutBlocked"]),
    Case("surge still blocked: the event is not repeated", "b", "a",
         cluster(a="ready", b="unschedulable"), {**PROGRESS_B, "phase": BLOCKED}, BLOCKED, "a"),
    Case("surge failed: the new revision crash-loops, the old one serves", "b", "a",
         cluster(a="ready", b="crash"), PROGRESS_B, FAILED, "a", events=["RolloutFailed"]),
    Case("surge failed: not Ready within the timeout", "b", "a",
         cluster(a="ready", b="loading"), {**PROGRESS_B, "startTime": at(-TIMEOUT - 1)},
         FAILED, "a", events=["RolloutFailed"]),
    Case("surge still failed: the event is not repeated", "b", "a",
         cluster(a="ready", b="crash"), {**PROGRESS_B, "phase": FAILED}, FAILED, "a"),
    # Draining
    Case("draining inside the window: the old revision stays, looked at again soon", "b",
         "b", cluster(a="ready", b="ready"), DRAIN_B, DRAINING, "b", wake=LOOK),
    Case("draining, the window nearly over: woken at its end", "b", "b",
         cluster(a="ready", b="ready"), {**DRAIN_B, "switchTime": at(-DRAIN + 2)}, DRAINING,
         "b", wake=3),
    Case("old pods idle at two looks and the router switched: removed before the window",
         "b", "b", cluster(a="ready", b="ready"), DRAIN_B, STEADY, "b", delete=["a"],
         events=["RolloutDrained"], load=idle(LOOK, *OLD_PODS)),
    Case("old pods idle at one look only: kept", "b", "b", cluster(a="ready", b="ready"),
         DRAIN_B, DRAINING, "b", wake=LOOK, load=idle(LOOK - 1, *OLD_PODS)),
    Case("one old pod still holds a request: kept", "b", "b",
         cluster(a="ready", b="ready"), DRAIN_B, DRAINING, "b", wake=LOOK,
         load=idle(30, "glm-decode-a-0")),
    Case("old pods idle but a router still sends to them: kept", "b", "b",
         cluster(a="ready", b="ready"), DRAIN_B, DRAINING, "b", wake=LOOK,
         load=idle(30, *OLD_PODS, switched=False)),
    Case("drain window over: the old revision is deleted", "b", "b",
         cluster(a="ready", b="ready"), {**DRAIN_B, "switchTime": at(-DRAIN)}, STEADY, "b",
         delete=["a"], events=["RolloutDrained"]),
    # Revert and supersede
    Case("revert mid-rollout: the pending revision goes, nothing serving is touched", "a", "a",
         cluster(a="ready", b="loading"), PROGRESS_B, STEADY, "a", delete=["b"]),
    Case("revert after a failed rollout", "a", "a", cluster(a="ready", b="crash"),
         {**PROGRESS_B, "phase": FAILED}, STEADY, "a", delete=["b"]),
    Case("revert while blocked", "a", "a", cluster(a="ready", b="unschedulable"),
         {**PROGRESS_B, "phase": BLOCKED}, STEADY, "a", delete=["b"]),
    Case("a third edit supersedes the pending revision", "c", "a",
         cluster(a="ready", b="loading"), PROGRESS_B, PROGRESSING, "a", delete=["b"],
         events=["RolloutStarted"], wake=TIMEOUT + 1),
    # Recreate (in place)
    Case("recreate starts: the old revision is deleted before the new one is applied", "b",
         "a", cluster(a="ready"), STEADY_A, RECREATING, "b", delete=["a"],
         events=["RolloutStarted"], apply=False, strategy="Recreate"),
    Case("recreate waits for the old pods to be gone", "b", "b", cluster(a="ready"),
         {"phase": RECREATING, "from": "a", "to": "b", "serving": "b"}, RECREATING, "b",
         delete=["a"], apply=False, strategy="Recreate"),
    Case("recreate loading: downtime lasts until the new revision is Ready", "b", "b",
         cluster(b="loading"), {"phase": RECREATING, "from": "a", "to": "b", "serving": "b"},
         RECREATING, "b", strategy="Recreate"),
    Case("recreate done", "b", "b", cluster(b="ready"),
         {"phase": RECREATING, "from": "a", "to": "b", "serving": "b"}, STEADY, "b",
         strategy="Recreate"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_step(case: Case):
    shortage_asked: list[bool] = []

    def shortage() -> str:
        shortage_asked.append(True)
        return SHORTAGE

    out = rollout.step(desired=case.desired, serving=case.serving, revisions=case.revisions,
                       previous=case.previous, policy=policy(case.strategy), now=NOW,
                       capacity_shortage=shortage, load=case.load)
    assert (out.phase, out.serving, sorted(out.delete), out.apply_desired) == (
        case.phase, case.now_serving, case.delete, case.apply)
    assert [reason for _, reason, _ in out.events] == case.events
    assert out.wake_after == case.wake
    assert out.status["to"] == case.desired and out.status["serving"] == case.now_serving
    assert (out.blocked is not None) == (case.phase == BLOCKED)
    assert (out.failed is not None) == (case.phase == FAILED)
    assert bool(shortage_asked) == (case.phase == BLOCKED)
    if case.phase == BLOCKED:
        assert out.blocked.startswith(SHORTAGE) and "revision a keeps serving" in out.blocked
    if case.phase == FAILED:
        assert "revision b failed, a keeps serving" in out.failed
    if case.phase == RECREATING:
        assert out.status["expectedDowntime"] == "about 9 min"


def test_the_phase_transition_time_moves_only_with_the_phase():
    kept = rollout.step(desired="b", serving="a", revisions=cluster(a="ready", b="loading"),
                        previous=PROGRESS_B, policy=policy(), now=NOW,
                        capacity_shortage=lambda: None)
    assert kept.status["lastTransitionTime"] == at(-100)
    assert kept.status["startTime"] == at(-100) and kept.status["from"] == "a"
    moved = rollout.step(desired="b", serving="a", revisions=cluster(a="ready", b="ready"),
                         previous=PROGRESS_B, policy=policy(), now=NOW,
                         capacity_shortage=lambda: None)
    assert moved.status["lastTransitionTime"] == at(0)
    assert moved.status["switchTime"] == at(0) and moved.status["drainUntil"] == at(DRAIN)


def test_a_switch_time_with_fractional_seconds_rounds_up():
    later = NOW + datetime.timedelta(microseconds=1)
    out = rollout.step(desired="b", serving="a", revisions=cluster(a="ready", b="ready"),
                       previous=PROGRESS_B, policy=policy(), now=later,
                       capacity_shortage=lambda: None)
    assert out.status["switchTime"] == at(1)


def test_group_revisions_ignores_unlabelled_objects_and_unknown_roles():
    stray = {"metadata": {"name": "x", "labels": {contract.PAIRING_LABEL: "a",
                                                  contract.COMPONENT_LABEL: "router"}}}
    unlabelled = {"metadata": {"name": "y", "labels": {}}}
    assert rollout.group_revisions([stray, unlabelled], [unlabelled]) == {}


# ---------------------------------------------------------------- scale-down drain


def spod(i: int, marked: Optional[float] = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"glm-decode-b-{i}"}
    if marked is not None:
        meta["annotations"] = {DRAINING_ANNOTATION: at(marked)}
    if deleting:
        meta["deletionTimestamp"] = at(-1)
    return {"metadata": meta}


def live(replicas: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}}


# (id, desired, live replicas, pods, replicas now, leave, rejoin, wake[, load])
SCALE = [
    ("scale-up never waits", 3, 2, [spod(0), spod(1)], 3, [], [], None),
    ("no change", 2, 2, [spod(0), spod(1)], 2, [], [], None),
    ("no live StatefulSet yet", 2, None, [], 2, [], [], None),
    ("scale-down: the removed pods leave the pool first, replicas kept", 1, 3,
     [spod(0), spod(1), spod(2)], 3, ["glm-decode-b-1", "glm-decode-b-2"], [], LOOK),
    ("a pod not yet marked holds the replicas", 1, 3,
     [spod(0), spod(1), spod(2, marked=-50)], 3, ["glm-decode-b-1"], [], LOOK),
    ("draining: replicas kept until the window passes", 1, 3,
     [spod(0), spod(1, marked=-20), spod(2, marked=-20)], 3, [], [], LOOK),
    ("the latest mark sets the window", 1, 3,
     [spod(0), spod(1, marked=-70), spod(2, marked=-DRAIN + 2)], 3, [], [], 3),
    ("the leaving pods idle at two looks, the router switched: removed before the window",
     1, 3, [spod(0), spod(1, marked=-20), spod(2, marked=-20)], 1, [], [], None,
     idle(LOOK, "glm-decode-b-1", "glm-decode-b-2")),
    ("one leaving pod still busy: kept", 1, 3,
     [spod(0), spod(1, marked=-20), spod(2, marked=-20)], 3, [], [], LOOK,
     idle(LOOK, "glm-decode-b-2")),
    ("idle, but the router still discovers them: kept", 1, 3,
     [spod(0), spod(1, marked=-20), spod(2, marked=-20)], 3, [], [], LOOK,
     idle(LOOK, "glm-decode-b-1", "glm-decode-b-2", switched=False)),
    ("the pods staying may be idle or not: it is the leaving ones that count", 1, 2,
     [spod(0), spod(1, marked=-20)], 1, [], [], None, idle(LOOK, "glm-decode-b-1")),
    ("drained: the StatefulSet gets the desired replicas", 1, 3,
     [spod(0), spod(1, marked=-DRAIN), spod(2, marked=-DRAIN)], 1, [], [], None),
    ("scaled back up mid-drain: the marked pods rejoin at once", 3, 3,
     [spod(0), spod(1, marked=-20), spod(2, marked=-20)], 3, [],
     ["glm-decode-b-1", "glm-decode-b-2"], None),
    ("partly scaled back: the kept pod rejoins, the other keeps draining", 2, 3,
     [spod(0), spod(1, marked=-10), spod(2, marked=-10)], 3, [], ["glm-decode-b-1"], LOOK),
    ("pods already being deleted are not waited for", 1, 3,
     [spod(0), spod(1, deleting=True), spod(2, deleting=True)], 1, [], [], None),
    ("to zero", 0, 1, [spod(0)], 1, ["glm-decode-b-0"], [], LOOK),
]


@pytest.mark.parametrize("case", SCALE, ids=[c[0] for c in SCALE])
def test_scale_down(case):
    _, desired, replicas, pods, now_replicas, leave, rejoin, wake, *load = case
    out = rollout.scale_down(desired, live(replicas) if replicas is not None else None, pods,
                             DRAIN, NOW, *load)
    assert (out.replicas, out.leave_pool, out.rejoin_pool, out.wake_after) == (
        now_replicas, leave, rejoin, wake)
    early = now_replicas < (replicas or 0) and bool(load)
    assert out.drained_early == (sorted(p["metadata"]["name"] for p in pods
                                        if int(p["metadata"]["name"][-1]) >= desired)
                                 if early else [])


def test_draining_marks_take_a_pod_out_of_the_pool_and_back():
    assert rollout.draining_marks(NOW, leave=True) == {
        "labels": {contract.SERVING_LABEL: "draining"},
        "annotations": {DRAINING_ANNOTATION: at(0)}}
    assert rollout.draining_marks(NOW, leave=False) == {
        "labels": {contract.SERVING_LABEL: "true"}, "annotations": {DRAINING_ANNOTATION: None}}
