"""The seed's shape, one pod per role, on the real control plane (kwok pods of
kwok_stages.LOAD_IMAGE become Ready after a simulated model load): an in-place edit and a
node drain replace a role's only pod beside the serving one instead of restarting it, and
only that role's (the other keeps its pod), the router's pool never selects zero Ready pods
of a role, and without room the operator says so before anything stops."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from longctx_core import contract
from tests.cluster.kwok_stages import LOAD_IMAGE
from tests.cluster.sampling import PoolSampler
from tests.cluster.test_rollout import condition, pinned, rollout_cr, status, two_nodes  # noqa: F401
from tests.conftest import revision_of, wait_for

pytestmark = pytest.mark.cluster
DECODE_EDIT = {"decode": ["--max-num-seqs", "32"]}


def engine_pods(cluster, namespace: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in cluster.list(
        "pods", namespace, "app.kubernetes.io/instance=glm")
        if p["metadata"]["labels"].get(contract.COMPONENT_LABEL) in contract.ROLES}


def pod_states(cluster, namespace: str) -> dict[str, tuple]:
    """Each engine pod's uid, phase, node, deletion and unmet conditions: what a timed-out wait
    shows."""
    return {n: (p["metadata"]["uid"], p["status"].get("phase"), p["spec"].get("nodeName"),
                p["metadata"].get("deletionTimestamp"),
                [(c["type"], c.get("reason"), c.get("message")) for c in
                 p["status"].get("conditions", []) if c.get("status") != "True"])
            for n, p in engine_pods(cluster, namespace).items()}


def role_revisions(cluster, namespace: str) -> dict[str, list[str]]:
    """Each role's StatefulSets (role revisions), all of the one pairing key."""
    out: dict[str, list[str]] = {}
    for sts in cluster.list("statefulsets", namespace, "app.kubernetes.io/instance=glm"):
        labels = sts["metadata"]["labels"]
        out.setdefault(labels[contract.COMPONENT_LABEL], []).append(
            labels[contract.ROLE_REVISION_LABEL])
    return out


def steady(cluster, namespace: str) -> dict[str, str] | None:
    """Each role's role revision once Ready, nothing rolling and no other role revision or
    pairing key left."""
    st = status(cluster, namespace)
    rev = st.get("revision")
    sets = role_revisions(cluster, namespace)
    keys = {s["metadata"]["labels"][contract.PAIRING_LABEL]
            for s in cluster.list("statefulsets", namespace, "app.kubernetes.io/instance=glm")}
    if st.get("phase") == "Ready" and (st.get("rollout") or {}).get("phase") == "Steady" \
            and keys == {rev} and all(len(sets.get(r, [])) == 1 for r in contract.ROLES):
        return {r: sets[r][0] for r in contract.ROLES}
    return None


def uids(cluster, namespace: str, role: str) -> set[str]:
    return {p["metadata"]["uid"] for p in engine_pods(cluster, namespace).values()
            if p["metadata"]["labels"][contract.COMPONENT_LABEL] == role}


def messages(cluster, namespace: str, reason: str) -> list[str]:
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    return [e["message"] for e in events["items"] if e["reason"] == reason]


def never_empty(sampler: PoolSampler) -> None:
    empty = [s for s in sampler.samples if not s.ready["prefill"] or not s.ready["decode"]]
    assert not empty, f"{len(empty)} of {len(sampler.samples)} samples: a role had no Ready pod"


def test_an_in_place_edit_of_a_single_pod_role_replaces_that_role_only(cluster, operator,
                                                                       namespace):
    cr = rollout_cr(LOAD_IMAGE)
    assert cluster.apply(cr, namespace).returncode == 0
    old = wait_for(lambda: steady(cluster, namespace), 90, "the first revision Ready")
    key = revision_of(cr)
    assert old == dict.fromkeys(contract.ROLES, key)
    prefill = uids(cluster, namespace, "prefill")
    sampler = PoolSampler(namespace, "glm")
    sampler.start()
    try:
        cr["spec"]["engine"]["extraArgs"] = DECODE_EDIT
        assert cluster.apply(cr, namespace).returncode == 0
        new = wait_for(lambda: (r := steady(cluster, namespace)) != old and r, 120,
                       "the decode replacement serving alone")
    finally:
        sampler.stop.set()
        sampler.join()
    never_empty(sampler)
    # One pairing key throughout: the pool selected it, and the prefill pod stayed.
    assert {s.selected for s in sampler.samples} == {key}
    assert new["prefill"] == key and new["decode"] != key
    assert uids(cluster, namespace, "prefill") == prefill
    (started,) = messages(cluster, namespace, "RolloutStarted")
    assert "decode has one pod (spec.decode.replicas = 1) and its pod template changes" \
        in started and "instead of a restart in place" in started \
        and "prefill keeps its pods" in started, started
    assert messages(cluster, namespace, "RolloutDrained")
    # Scaling it up later is in place: no third role revision.
    cr["spec"]["decode"]["replicas"] = 2
    assert cluster.apply(cr, namespace).returncode == 0
    wait_for(lambda: steady(cluster, namespace) == new and len(engine_pods(
        cluster, namespace)) == 3, 90, "two decode pods in the replacement role revision")


def test_without_room_it_says_so_and_stops_nothing(cluster, operator, namespace, two_nodes):
    cr = pinned(rollout_cr(LOAD_IMAGE), two_nodes)
    assert cluster.apply(cr, namespace).returncode == 0
    wait_for(lambda: steady(cluster, namespace), 90, "the first revision Ready")
    before = {n: p["metadata"]["uid"] for n, p in engine_pods(cluster, namespace).items()}
    cr["spec"]["engine"]["extraArgs"] = DECODE_EDIT
    assert cluster.apply(cr, namespace).returncode == 0
    blocked = wait_for(lambda: (c := condition(cluster, namespace, "RolloutBlocked")).get(
        "status") == "True" and c, 60, "RolloutBlocked")
    message = blocked["message"]
    for words in ("decode has one pod (spec.decode.replicas = 1)", "nothing is stopped",
                  "spec.rollout.strategy to Recreate", "free: 0"):
        assert words in message, message
    assert messages(cluster, namespace, "RolloutBlocked")
    time.sleep(3)
    pods = engine_pods(cluster, namespace)
    assert {n: p["metadata"]["uid"] for n, p in pods.items() if n in before} == before
    # The user accepts the gap: Recreate restarts the pod in place.
    cr["spec"]["rollout"]["strategy"] = "Recreate"
    assert cluster.apply(cr, namespace).returncode == 0

    def decode_restarted() -> bool:
        now = engine_pods(cluster, namespace)
        return steady(cluster, namespace) is not None and any(
            p["metadata"]["labels"][contract.COMPONENT_LABEL] == "decode"
            and p["metadata"]["uid"] not in before.values() for p in now.values())
    try:
        wait_for(decode_restarted, 120, "the decode pod restarted in place")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; pods: {pod_states(cluster, namespace)}; old uids: "
                             f"{before}; status: {status(cluster, namespace)}") from None


def test_a_node_drain_moves_the_only_pod_first(cluster, operator, namespace):
    cr = rollout_cr(LOAD_IMAGE)
    assert cluster.apply(cr, namespace).returncode == 0
    old = wait_for(lambda: steady(cluster, namespace), 90, "the first revision Ready")
    (decode,) = [p for p in engine_pods(cluster, namespace).values()
                 if p["metadata"]["labels"][contract.COMPONENT_LABEL] == "decode"]
    node = decode["spec"]["nodeName"]
    (prefill,) = [p for p in engine_pods(cluster, namespace).values()
                  if p["metadata"]["labels"][contract.COMPONENT_LABEL] == "prefill"]
    moves_prefill = prefill["spec"]["nodeName"] == node
    sampler = PoolSampler(namespace, "glm")
    sampler.start()
    drain = subprocess.Popen(
        [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig),
         "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=150s",
         "--pod-selector", "app.kubernetes.io/instance=glm"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        new = wait_for(lambda: (r := steady(cluster, namespace)) != old and r, 150,
                       "the replacement serving from another node")
        out, _ = drain.communicate(timeout=120)
        assert drain.returncode == 0, out
    finally:
        if drain.poll() is None:
            drain.kill()
        sampler.stop.set()
        sampler.join()
        cluster.kubectl("uncordon", node, check=False)
    never_empty(sampler)
    assert all(p["spec"].get("nodeName") != node
               for p in engine_pods(cluster, namespace).values())
    (started,) = messages(cluster, namespace, "RolloutStarted")
    assert f"on node {node}, which is being drained" in started, started
    # The evictions kubectl retried were refused by the PodDisruptionBudget meanwhile.
    assert "disruption budget" in out, out
    assert new["decode"] != old["decode"]
    # A pod on another node stays where it is.
    assert moves_prefill or prefill["metadata"]["uid"] in uids(cluster, namespace, "prefill")
