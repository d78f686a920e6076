"""Status from children (pure)."""

from __future__ import annotations

from longctx_operator.controller.status import Observed, Refusal, compute_status, status_changed

CR = {"metadata": {"name": "glm", "generation": 2}, "spec": {"maxContextTokens": 1048576}}


def sts(ready=1, updated=1, replicas=1, generation=1, observed=1):
    return {"metadata": {"generation": generation},
            "spec": {"replicas": replicas},
            "status": {"readyReplicas": ready, "updatedReplicas": updated,
                       "observedGeneration": observed}}


def pod(role, **status):
    return {"metadata": {"name": f"glm-{role}-0", "labels": {"app.kubernetes.io/component": role}},
            "status": status}


def status_for(statefulsets, pods=(), router=(True, "Available", "ok"), refusal=None,
               previous=None):
    return compute_status(CR, refusal=refusal, plan={"fits": True},
                          observed=Observed(statefulsets=statefulsets, pods=list(pods),
                                            router=router),
                          desired_replicas={"prefill": 1, "decode": 1}, endpoint="x",
                          previous=previous)


def conds(status):
    return {c["type"]: c for c in status["conditions"]}


def test_all_ready():
    status = status_for({"prefill": sts(), "decode": sts()})
    c = conds(status)
    assert status["phase"] == "Ready" and c["Ready"]["status"] == "True"
    assert c["Progressing"]["status"] == "False"
    assert status["prefill"]["summary"] == "1/1"
    assert status["observedGeneration"] == 2


def test_waiting_for_pods_is_progressing_with_the_reason():
    status = status_for({"prefill": sts(ready=0), "decode": sts()})
    c = conds(status)
    assert status["phase"] == "Progressing"
    assert c["PrefillReady"]["reason"] == "PodsNotReady"
    assert c["Ready"]["status"] == "False" and "PrefillReady" in c["Ready"]["message"]


def test_crash_loop_turns_degraded_with_the_containers_reason():
    crashing = pod("decode", containerStatuses=[{
        "name": "engine", "restartCount": 5,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                     "message": "/dev/shm too small"}}}])
    status = status_for({"prefill": sts(), "decode": sts(ready=0)}, pods=[crashing])
    c = conds(status)
    assert status["phase"] == "Degraded"
    assert c["Degraded"]["status"] == "True" and "/dev/shm too small" in c["Degraded"]["message"]
    assert c["DecodeReady"]["reason"] == "CrashLoop"


def test_unschedulable_pod_says_why():
    pending = pod("prefill", conditions=[{"type": "PodScheduled", "status": "False",
                                          "message": "0/4 nodes are available: 4 Insufficient "
                                                     "nvidia.com/gpu."}])
    status = status_for({"prefill": sts(ready=0), "decode": sts()}, pods=[pending])
    c = conds(status)
    assert c["PrefillReady"]["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in c["Ready"]["message"]


def test_refusal_keeps_the_message_and_is_not_progressing():
    refusal = Refusal("CapacityPlanned", "InsufficientKVCapacity", "set decode to 8")
    status = status_for({"prefill": sts(), "decode": sts()}, refusal=refusal)
    c = conds(status)
    assert status["phase"] == "Refused"
    assert c["CapacityPlanned"]["status"] == "False" and c["Progressing"]["status"] == "False"
    assert "set decode to 8" in c["Ready"]["message"]


def test_unchanged_status_is_not_written_and_timestamps_stay():
    first = status_for({"prefill": sts(), "decode": sts()})
    second = status_for({"prefill": sts(), "decode": sts()}, previous=first)
    assert not status_changed(first, second)
    third = status_for({"prefill": sts(ready=0), "decode": sts()}, previous=first)
    assert status_changed(first, third)
    assert conds(third)["DecodeReady"]["lastTransitionTime"] == \
        conds(first)["DecodeReady"]["lastTransitionTime"]
