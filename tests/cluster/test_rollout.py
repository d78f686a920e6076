"""Revisioned rollouts on the real control plane: engine pods of kwok_stages.LOAD_IMAGE*
become Ready only after the control plane's simulated model load."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from longctx_core import contract
from tests.cluster.kwok_stages import CRASH_IMAGE, LOAD_IMAGE, LOAD_IMAGE_2
from tests.cluster.manifests import h200_node
from tests.cluster.sampling import SAMPLE_SECONDS, PoolSampler
from tests.conftest import example_cr, revision_of, sts_name, wait_for

pytestmark = pytest.mark.cluster


def rollout_cr(image: str = LOAD_IMAGE, **changes: Any) -> dict:
    cr = example_cr("glm")
    cr["spec"].setdefault("engine", {})["image"] = image
    cr["spec"]["rollout"] = {"drainSeconds": 3, **changes}
    return cr


def status(cluster, namespace: str) -> dict:
    return (cluster.get("lcd", "glm", namespace) or {}).get("status", {})


def condition(cluster, namespace: str, type_: str) -> dict:
    return next((c for c in status(cluster, namespace).get("conditions", [])
                 if c["type"] == type_), {})


def settled_on(cluster, namespace: str, cr: dict) -> bool:
    """Ready, nothing rolling, and only the CR's revision left."""
    st = status(cluster, namespace)
    revisions = {s["metadata"]["labels"][contract.PAIRING_LABEL] for s in cluster.list(
        "statefulsets", namespace, "app.kubernetes.io/instance=glm")}
    return (st.get("phase") == "Ready" and (st.get("rollout") or {}).get("phase") == "Steady"
            and st.get("revision") == revision_of(cr) and revisions == {revision_of(cr)})


def event_reasons(cluster, namespace: str) -> set[str]:
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    return {e["reason"] for e in events["items"]}


def test_surge_image_upgrade_never_leaves_the_pool_empty_or_mixed(cluster, operator, namespace):
    old, new = rollout_cr(LOAD_IMAGE), rollout_cr(LOAD_IMAGE_2)
    assert cluster.apply(old, namespace).returncode == 0
    wait_for(lambda: settled_on(cluster, namespace, old), 90, "the first revision Ready")
    old_pods = {f"{sts_name(old, role)}-0" for role in contract.ROLES}

    sampler = PoolSampler(namespace, "glm")
    sampler.start()
    try:
        edited = time.monotonic()
        assert cluster.apply(new, namespace).returncode == 0
        try:
            wait_for(lambda: settled_on(cluster, namespace, new), 120, "the new revision settled")
        except AssertionError:  # what the rollout was doing
            print(json.dumps(status(cluster, namespace).get("rollout"), indent=1))
            raise
        # The StatefulSets are gone; their pods may still be terminating.
        switch = sampler.until(lambda s: s.selected == revision_of(new), 30,
                               "the pool switched to the new revision")
        gone = sampler.until(lambda s: not old_pods & s.pods, 60, "the old pods deleted")
    finally:
        sampler.stop.set()
        sampler.join()
    samples = sampler.samples
    assert len(samples) >= (samples[-1].t - samples[0].t) / SAMPLE_SECONDS * 0.5, len(samples)
    for s in samples:
        assert s.ready["prefill"] and s.ready["decode"], f"no Ready pod at +{s.t - edited:.1f} s"
        assert len(s.revisions) == 1, f"two revisions selected at +{s.t - edited:.1f} s"
    assert switch.t - edited >= cluster.cp.load_seconds * 0.8, "switched before the new load"
    assert old_pods <= switch.pods, "the old pods were deleted before the new revision served"
    assert gone.t - switch.t >= 2.5, "the old revision was not drained"
    wait_for(lambda: {"RolloutStarted", "RolloutSwitched", "RolloutDrained"} <= event_reasons(
        cluster, namespace), 20, "the rollout's Events")
    rollout = status(cluster, namespace)["rollout"]
    assert (rollout["from"], rollout["to"], rollout["strategy"]) == (
        revision_of(old), revision_of(new), "Surge")
    printed = cluster.kubectl("get", "lcd", "-n", namespace, "-o", "wide").stdout
    assert "Steady" in printed and revision_of(new) in printed, printed


@pytest.fixture
def two_nodes(cluster, namespace):
    """A node selector that matches exactly two of the 8-GPU nodes: room for one pair."""
    label = f"longctx.dev/test-pool={namespace}"
    nodes = [n["metadata"]["name"] for n in cluster.list("nodes", "default")][:2]
    for n in nodes:
        cluster.kubectl("label", "node", n, label)
    added: list[str] = []
    yield {"label": label.split("="), "added": added}
    for n in nodes:
        cluster.kubectl("label", "node", n, f"{label.split('=')[0]}-", check=False)
    for n in added:
        cluster.kubectl("delete", "node", n, "--wait=false", check=False)


def pinned(cr: dict, two_nodes: dict) -> dict:
    key, value = two_nodes["label"]
    cr["spec"]["placement"] = {"nodeSelector": {key: value}}
    return cr


def test_recreate_on_room_for_one_pair_states_the_downtime(cluster, operator, namespace,
                                                           two_nodes):
    old = pinned(rollout_cr(LOAD_IMAGE, strategy="Recreate"), two_nodes)
    new = pinned(rollout_cr(LOAD_IMAGE_2, strategy="Recreate"), two_nodes)
    assert cluster.apply(old, namespace).returncode == 0
    wait_for(lambda: settled_on(cluster, namespace, old), 90, "the first revision Ready")
    assert cluster.apply(new, namespace).returncode == 0
    recreating = wait_for(lambda: (r := status(cluster, namespace).get("rollout") or {}).get(
        "phase") == "Recreating" and r, 30, "phase Recreating")
    assert "engineReadyTimeoutSeconds" in recreating["expectedDowntime"], recreating
    wait_for(lambda: settled_on(cluster, namespace, new), 120, "Ready on the new revision")
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    started = [e for e in events["items"] if e["reason"] == "RolloutStarted"]
    assert started and "no request is served" in started[0]["message"], started


def test_surge_without_room_is_blocked_until_a_node_is_added(cluster, operator, namespace,
                                                             two_nodes):
    old = pinned(rollout_cr(LOAD_IMAGE), two_nodes)
    new = pinned(rollout_cr(LOAD_IMAGE_2), two_nodes)
    assert cluster.apply(old, namespace).returncode == 0
    wait_for(lambda: settled_on(cluster, namespace, old), 90, "the first revision Ready")
    assert cluster.apply(new, namespace).returncode == 0
    blocked = wait_for(lambda: (c := condition(cluster, namespace, "RolloutBlocked")).get(
        "status") == "True" and c, 60, "RolloutBlocked")
    assert "needs 16 more NVIDIA-H200 GPUs" in blocked["message"], blocked["message"]
    assert "free: 0" in blocked["message"] and "Recreate" in blocked["message"]
    assert status(cluster, namespace)["phase"] in ("Ready", "Progressing")
    assert condition(cluster, namespace, "PrefillReady")["status"] == "True"  # old serves
    key, value = two_nodes["label"]
    for i in range(2):
        node = h200_node(f"h200-{namespace}-{i}")
        node["metadata"]["labels"][key] = value
        two_nodes["added"].append(node["metadata"]["name"])
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
    wait_for(lambda: settled_on(cluster, namespace, new), 120, "the rollout finished")
    assert condition(cluster, namespace, "RolloutBlocked")["status"] == "False"


def test_a_crash_looping_revision_fails_and_a_revert_restarts_nothing(cluster, operator,
                                                                      namespace):
    old, bad = rollout_cr(LOAD_IMAGE), rollout_cr(CRASH_IMAGE)
    assert cluster.apply(old, namespace).returncode == 0
    wait_for(lambda: settled_on(cluster, namespace, old), 90, "the first revision Ready")
    uids = {cluster.get("pod", f"{sts_name(old, r)}-0", namespace)["metadata"]["uid"]
            for r in contract.ROLES}
    assert cluster.apply(bad, namespace).returncode == 0
    degraded = wait_for(lambda: (c := condition(cluster, namespace, "Degraded")).get(
        "reason") == "RolloutFailed" and c, 60, "Degraded RolloutFailed")
    assert "simulated engine crash" in degraded["message"], degraded["message"]
    assert status(cluster, namespace)["revision"] == revision_of(old)
    assert condition(cluster, namespace, "Ready")["status"] == "True"  # the old one serves

    assert cluster.apply(old, namespace).returncode == 0
    wait_for(lambda: settled_on(cluster, namespace, old), 60, "back on the old revision")
    after = {p["metadata"]["uid"]: p for p in cluster.list(
        "pods", namespace, "app.kubernetes.io/instance=glm,llm-d.ai/inference-serving=true")}
    assert set(after) == uids, "a pod of the serving revision was replaced"
    assert all(cs.get("restartCount", 0) == 0 for p in after.values()
               for cs in p["status"].get("containerStatuses", []))


def test_bad_rollout_input_is_refused_at_apply(cluster, namespace):
    cr = rollout_cr(strategy="BlueGreen")
    proc = cluster.apply(cr, namespace, "--dry-run=server")
    assert proc.returncode != 0 and "spec.rollout.strategy" in proc.stderr, proc.stderr
    cr = rollout_cr(minReadyReplicas=2)
    proc = cluster.apply(cr, namespace, "--dry-run=server")
    assert proc.returncode != 0 and "rollout.minReadyReplicas (2)" in proc.stderr, proc.stderr
