"""The reconcile against an in-memory cluster (fake_cluster.py), in milliseconds: what it
writes, the rollout's steps, a drain, a node drain and the data-path report. The real
control plane proves the same in tests/cluster/."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path

import pytest
import yaml

from longctx_core import contract
from longctx_operator.controller import rollout_cost
from longctx_operator.controller.memory import Memory
from longctx_operator.controller.builders import vllm_router
from longctx_operator.controller import reconcile as reconcile_module
from longctx_operator.controller.reconcile import reconcile
from tests.operator.fake_cluster import FakeCluster

REPO = Path(__file__).resolve().parents[2]
NS, NAME = "ml", "tiny"


@pytest.fixture(autouse=True)
def no_scrapes(monkeypatch):
    # The fake pods' addresses are never read: a Ready pod that cannot be read is busy.
    monkeypatch.setenv("LONGCTX_ENGINE_METRICS_NETWORKS", "127.0.0.1/32")


@pytest.fixture(autouse=True)
def memory():
    """The operator's memory between reconciles: one per test, as one per operator."""
    MEMORY.clear()
    MEMORY.append(Memory())
    return MEMORY[0]


MEMORY: list[Memory] = []


def node(name: str, cordoned: bool = False, labels: dict | None = None, gpus: int = 0) -> dict:
    return {"metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"allocatable": {"memory": "2Ti", "cpu": "64",
                                       **({contract.GPU_RESOURCE: str(gpus)} if gpus else {})}}}


def deploy(fake: FakeCluster, **spec) -> dict:
    cr = yaml.safe_load((REPO / "examples" / "tiny-mla-cpu.yaml").read_text())
    cr["metadata"] = {"name": NAME, "namespace": NS, "uid": "cr-uid", "generation": 1}
    cr["spec"]["rollout"] = {"drainSeconds": 0}
    cr["spec"].update(spec)
    fake.objects[(contract.KIND, NS, NAME)] = cr
    return cr


def edit(fake: FakeCluster, change) -> None:
    cr = fake.objects[(contract.KIND, NS, NAME)]
    change(cr["spec"])
    cr["metadata"]["generation"] += 1


def run(fake: FakeCluster):
    return reconcile(fake, copy.deepcopy(fake.objects[(contract.KIND, NS, NAME)]), MEMORY[0])


def status(fake: FakeCluster) -> dict:
    return fake.objects[(contract.KIND, NS, NAME)].get("status") or {}


def revisions(fake: FakeCluster) -> set[str]:
    return {o["metadata"]["labels"][contract.PAIRING_LABEL]
            for (kind, _, _), o in fake.objects.items() if kind == "StatefulSet"}


def router_revision(fake: FakeCluster) -> str:
    dep = fake.objects[("Deployment", NS, contract.vllm_router(NAME))]
    return dep["spec"]["template"]["metadata"]["labels"][contract.PAIRING_LABEL]


def reasons(outcome) -> list[str]:
    return [reason for _, reason, _ in outcome.events]


def steady(fake: FakeCluster) -> str:
    """Ready pods, reconciled until nothing rolls; the serving revision."""
    for _ in range(4):
        fake.ready()
        run(fake)
    assert status(fake)["phase"] == "Ready", status(fake)
    return status(fake)["revision"]


def test_a_new_cr_creates_one_revision_and_turns_ready():
    fake = FakeCluster(nodes=[node("node-a")])
    deploy(fake)
    first = run(fake)
    assert "Created" in reasons(first) and status(fake)["phase"] == "Progressing"
    (revision,) = revisions(fake)
    assert router_revision(fake) == revision
    assert steady(fake) == revision
    # A reconcile with nothing new writes nothing.
    fake.writes.clear()
    assert not run(fake).applied and fake.writes == []


def statefulsets(fake: FakeCluster) -> set[str]:
    return {name for (kind, _, name) in fake.objects if kind == "StatefulSet"}


def pod_uids(fake: FakeCluster, role: str) -> set[str]:
    return {o["metadata"]["uid"] for (kind, _, _), o in fake.objects.items() if kind == "Pod"
            and o["metadata"]["labels"].get(contract.COMPONENT_LABEL) == role}


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_single_pod_edit_replaces_that_role_only_beside_then_switched_then_removed(
        monkeypatch, role):
    (other,) = set(contract.ROLES) - {role}
    fake = FakeCluster(nodes=[node("node-a")])
    deploy(fake)
    key = steady(fake)
    kept_set = contract.statefulset(NAME, other, key)
    old_set = contract.statefulset(NAME, role, key)
    kept_pods = pod_uids(fake, other)
    edit(fake, lambda s: s["engine"].setdefault("extraArgs", {}).update(
        {role: ["--max-num-seqs", "3"]}))
    out = run(fake)
    (new_set,) = statefulsets(fake) - {kept_set, old_set}
    assert new_set.startswith(f"{NAME}-{role}-")
    message = dict((r, m) for _, r, m in out.events)["RolloutStarted"]
    assert f"{role} has one pod (spec.{role}.replicas = 1)" in message, message
    assert f"{other} keeps its pods" in message, message
    # What it costs, said as it starts.
    kept = "prefill keeps its warm prefixes" if role == "decode" else \
        "prefill's new pods start with an empty prefix cache"   # the example has no CPU tier
    assert kept in message, message
    assert status(fake)["rollout"]["cost"]["roles"] == {role: rollout_cost.BESIDE,
                                                        other: rollout_cost.KEEPS}
    # One pairing key: the router selects it, old and new pods of the role alike.
    assert router_revision(fake) == key and revisions(fake) == {key}
    assert f"StatefulSet/{kept_set}" not in out.applied
    assert status(fake)["rollout"]["phase"] == "Progressing"
    assert status(fake)["rollout"]["roles"] == [role]
    fake.ready()
    switched = run(fake)
    assert "RolloutSwitched" in reasons(switched)
    old_pod = fake.objects[("Pod", NS, f"{old_set}-0")]
    assert old_pod["metadata"]["labels"][contract.SERVING_LABEL] == "draining"
    dep = fake.objects[("Deployment", NS, contract.vllm_router(NAME))]
    assert dep["spec"]["template"]["metadata"]["annotations"][
        vllm_router.DRAINING_PODS_ANNOTATION] == f"{old_set}-0"
    assert old_set in statefulsets(fake)   # the router has not rolled out yet
    fake.ready()
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=5)
    monkeypatch.setattr(reconcile_module, "_utcnow", lambda: later)   # the window is over
    drained = run(fake)
    assert "RolloutDrained" in reasons(drained)
    assert statefulsets(fake) == {kept_set, new_set}
    assert ("PodDisruptionBudget", NS, old_set) not in fake.objects
    assert status(fake)["revision"] == key and pod_uids(fake, other) == kept_pods
    fake.ready()
    run(fake)
    assert status(fake)["phase"] == "Ready" and status(fake)["rollout"]["phase"] == "Steady"


def test_a_new_pairing_key_surges_both_roles_while_the_serving_pair_reports_ready():
    fake = FakeCluster(nodes=[node("node-a")])
    deploy(fake)
    old = steady(fake)
    edit(fake, lambda s: s["engine"].update(image=s["engine"]["image"] + "-next"))
    out = run(fake)
    (new,) = revisions(fake) - {old}
    message = dict((r, m) for _, r, m in out.events)["RolloutStarted"]
    assert "prefill's new pods start" in message and "decode: new pods beside" in message
    assert status(fake)["rollout"]["cost"]["newPairingKey"]
    conditions = {c["type"]: c["status"] for c in status(fake)["conditions"]}
    assert conditions["PrefillReady"] == conditions["DecodeReady"] == "True", conditions
    assert router_revision(fake) == old and status(fake)["revision"] == old
    fake.ready()
    assert "RolloutSwitched" in reasons(run(fake)) and router_revision(fake) == new


def router_pod_on(fake: FakeCluster, node_name: str) -> None:
    """vllm-router's pod, running on `node_name`."""
    fake.objects[("Pod", NS, "tiny-router-x")] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tiny-router-x", "namespace": NS,
                     "labels": contract.selector_labels(NAME, contract.ROUTER_COMPONENT)},
        "spec": {"nodeName": node_name}, "status": {}}


def test_a_cordoned_node_replaces_the_single_pods_and_moves_the_router():
    fake = FakeCluster(nodes=[node("node-a"), node("node-b")])
    deploy(fake)
    old = steady(fake)
    router_pod_on(fake, "node-a")
    fake._nodes = [node("node-a", cordoned=True), node("node-b")]
    before = statefulsets(fake)
    out = run(fake)
    # Both roles' only pods are on the drained node: each gets a new role revision beside.
    assert len(statefulsets(fake) - before) == 2 and revisions(fake) == {old}
    events = dict((r, m) for _, r, m in out.events)
    assert "on node node-a, which is being drained" in events["RolloutStarted"]
    assert "node-a" in events["RouterMoving"]
    dep = fake.objects[("Deployment", NS, contract.vllm_router(NAME))]
    assert dep["spec"]["template"]["metadata"]["annotations"][
        vllm_router.LEAVING_NODES_ANNOTATION] == "node-a"
    # The engines' and the router's; the endpoint's lets one of its pods go at a time.
    pdbs = [o for (k, _, name), o in fake.objects.items() if k == "PodDisruptionBudget"
            and name != contract.endpoint(NAME)]
    assert pdbs and all(p["spec"]["maxUnavailable"] == 0 for p in pdbs)


def test_an_engine_that_died_is_reported_once():
    fake = FakeCluster(nodes=[node("node-a")])
    deploy(fake)
    revision = steady(fake)
    pod = fake.objects[("Pod", NS, f"{contract.statefulset(NAME, 'decode', revision)}-0")]
    finished = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod["status"]["containerStatuses"] = [{"name": "engine", "restartCount": 1, "lastState": {
        "terminated": {"reason": "Error", "exitCode": 137, "finishedAt": finished}}}]
    out = run(fake)
    (message,) = [m for _, r, m in out.events if r == "EngineRestarted"]
    assert pod["metadata"]["name"] in message and "finish_reason" in message
    condition = next(c for c in status(fake)["conditions"] if c["type"] == "DataPathHealthy")
    assert condition["status"] == "False" and condition["reason"] == "EngineRestarted"
    assert out.wake_after is not None        # looked at again when the condition clears
    assert "EngineRestarted" not in reasons(run(fake))


def test_one_reconcile_plans_once_and_renders_each_role_once(monkeypatch):
    """Every capacity plan built anywhere (the reconcile, the picker's prefix index, the
    capacity rules) is counted, for an llm-d CR whose picker and rules read the plan."""
    from longctx_core.sizing import planner
    from longctx_operator.controller import rendering
    calls = {"plan": 0, "render": 0}
    real_init, real_render = planner.CapacityPlan.__init__, rendering.launch_document

    def plan_init(self, *args, **kw):
        calls["plan"] += 1
        real_init(self, *args, **kw)

    def render(*args, **kw):
        calls["render"] += 1
        return real_render(*args, **kw)
    monkeypatch.setattr(planner.CapacityPlan, "__init__", plan_init)
    monkeypatch.setattr(rendering, "launch_document", render)
    fake = FakeCluster(nodes=[node("node-a")])
    deploy(fake, router={"type": "llm-d"})
    steady(fake)
    edit(fake, lambda s: s["engine"].setdefault("extraArgs", {}).update(
        decode=["--max-num-seqs", "3"]))     # a replacement: the most a reconcile renders
    calls.update(plan=0, render=0)
    run(fake)
    assert calls == {"plan": 1, "render": 2}, calls


def test_the_old_pods_outlive_an_old_router_pod_still_shutting_down(monkeypatch, memory):
    """A router pod of the old template, still terminating, serves whoever holds its
    address: the old decode pod stays until it is gone, though its engine is idle."""
    from longctx_operator.controller import engine_load
    # The engine watch read every pod idle just now, at each reconcile's time.
    monkeypatch.setattr(memory.loads, "of", lambda pod: engine_load.PodLoad(
        0.0, True, reconcile_module._utcnow()))
    fake = FakeCluster(nodes=[node("node-a")])
    cr = deploy(fake)
    cr["spec"]["rollout"] = {"drainSeconds": 300}
    old = steady(fake)
    edit(fake, lambda s: s["engine"].setdefault("extraArgs", {}).update(
        decode=["--max-num-seqs", "3"]))
    run(fake)
    fake.ready()
    assert "RolloutSwitched" in reasons(run(fake))
    fake.ready()
    fake.objects[("Pod", NS, "tiny-router-old")] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "tiny-router-old", "namespace": NS,
            "deletionTimestamp": "2026-12-04T00:00:00Z",
            "labels": {**contract.selector_labels(NAME, contract.ROUTER_COMPONENT),
                       contract.PAIRING_LABEL: old}}, "spec": {"nodeName": "node-a"}}
    now = datetime.datetime.now(datetime.timezone.utc)
    for seconds in (0, 6, 12):   # idle at looks more than 5 s apart
        monkeypatch.setattr(reconcile_module, "_utcnow",
                            lambda s=seconds: now + datetime.timedelta(seconds=s))
        assert "RolloutDrained" not in reasons(run(fake))
    old_decode = contract.statefulset(NAME, "decode", old)
    assert old_decode in statefulsets(fake)
    del fake.objects[("Pod", NS, "tiny-router-old")]
    monkeypatch.setattr(reconcile_module, "_utcnow",
                        lambda: now + datetime.timedelta(seconds=18))
    drained = [m for _, r, m in run(fake).events if r == "RolloutDrained"]
    assert drained and "held no request" in drained[0]
    assert old_decode not in statefulsets(fake)


def reconciled_once(fake: FakeCluster):
    """One reconcile, which reads one snapshot (one read of the StatefulSets) and the
    Deployments (the vllm-router's) once, both from the caches."""
    observed, deployment_reads = fake.observed, fake.deployment_reads
    out = run(fake)
    assert (fake.observed - observed, fake.deployment_reads - deployment_reads) == (1, 1)
    return out


def pending(fake: FakeCluster, revision: str) -> None:
    """The revision's pods exist and the scheduler finds no room for them."""
    for (kind, ns, name), sts in list(fake.objects.items()):
        if kind == "StatefulSet" and sts["metadata"]["labels"][contract.PAIRING_LABEL] == revision:
            labels = {**sts["spec"]["template"]["metadata"]["labels"],
                      contract.POD_INDEX_LABEL: "0"}
            fake.objects[("Pod", ns, f"{name}-0")] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-0", "namespace": ns, "labels": labels},
                "spec": {"containers": sts["spec"]["template"]["spec"]["containers"]},
                "status": {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]}}


def test_no_reconcile_reads_around_the_caches():
    """A new CR, a spec edit that rolls a role, a scale-down, a node drain and a rollout
    blocked for GPUs, with a topologyKey: each reconcile reads one snapshot, the
    vllm-router Deployment once, and nothing the watch caches cannot serve (the Nodes and
    the GPUs in use included)."""
    rack = {"example.com/rack": "r1", "nvidia.com/gpu.product": "NVIDIA-H200"}
    fake = FakeCluster(nodes=[node("node-a", labels=rack, gpus=1),
                              node("node-b", labels=rack, gpus=1)])
    deploy(fake, placement={"topologyKey": "example.com/rack"})
    edit(fake, lambda s: s["prefill"].update(replicas=2))
    for _ in range(4):
        fake.ready()
        reconciled_once(fake)
    assert status(fake)["phase"] == "Ready", status(fake)
    for change in (lambda s: s["engine"].setdefault("extraArgs", {}).update(
                       {"decode": ["--max-num-seqs", "3"]}),
                   lambda s: s["prefill"].update(replicas=1)):
        edit(fake, change)
        for _ in range(3):
            fake.ready()
            reconciled_once(fake)
    router_pod_on(fake, "node-a")
    fake._nodes = [node("node-a", cordoned=True, labels=rack, gpus=1),
                   node("node-b", labels=rack, gpus=1)]
    assert "RouterMoving" in reasons(reconciled_once(fake))
    del fake.objects[("Pod", NS, "tiny-router-x")]
    fake._nodes = [node("node-a", labels=rack, gpus=1), node("node-b", labels=rack, gpus=1)]
    for _ in range(4):
        fake.ready()
        reconciled_once(fake)
    # Another team's pod holds node-b's GPU: what the GPU-use cache counts.
    fake.objects[("Pod", "other-team", "trainer")] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "other-team", "labels": {}},
        "spec": {"nodeName": "node-b", "containers": [{"name": "t", "resources": {
            "requests": {contract.GPU_RESOURCE: "1"}}}]}, "status": {"phase": "Running"}}
    serving = status(fake)["revision"]
    edit(fake, lambda s: s["engine"].update(image=s["engine"]["image"] + "-next"))
    reconciled_once(fake)
    (new,) = revisions(fake) - {serving}
    pending(fake, new)
    reconciled_once(fake)
    blocked = next(c for c in status(fake)["conditions"] if c["type"] == "RolloutBlocked")
    assert blocked["status"] == "True", blocked
    assert "needs 2 more" in blocked["message"] and "free: 1" in blocked["message"], blocked
    assert fake.uncached == []


def test_equal_snapshots_desire_equal_objects():
    """The desired state is a pure function of the snapshot: desired from two snapshots of
    the same cluster (a CR whose old decode pod drains, a cordoned node under the router),
    it is equal, the router's part included, and desiring read and wrote nothing."""
    from longctx_operator.controller.desire import SpecPlans, desire, draining_pods, intend
    from longctx_operator.controller.observe import observe
    fake = FakeCluster(nodes=[node("node-a"), node("node-b")])
    deploy(fake)
    steady(fake)
    edit(fake, lambda s: s["engine"].setdefault("extraArgs", {}).update(
        {"decode": ["--max-num-seqs", "3"]}))
    run(fake)
    fake.ready()
    run(fake)
    router_pod_on(fake, "node-a")
    fake._nodes = [node("node-a", cordoned=True), node("node-b")]
    cr = fake.objects[(contract.KIND, NS, NAME)]
    now = reconcile_module._utcnow()
    snapshots = [observe(fake, copy.deepcopy(cr), now) for _ in range(2)]
    reads = (fake.observed, fake.deployment_reads, len(fake.writes))
    desired = []
    for snapshot in snapshots:
        intent = intend(snapshot, SpecPlans())
        desired.append(desire(snapshot, intent, {p["metadata"]["name"]: 1.0
                                                 for p in draining_pods(intent)}))
    first, second = desired
    assert first == second
    assert (fake.observed, fake.deployment_reads, len(fake.writes)) == reads
    (router,) = [o for o in first.objects if o["kind"] == "Deployment"
                 and o["metadata"]["name"] == contract.vllm_router(NAME)]
    annotations = router["spec"]["template"]["metadata"]["annotations"]
    assert annotations[vllm_router.LEAVING_NODES_ANNOTATION] == "node-a"
    assert annotations[vllm_router.DRAINING_PODS_ANNOTATION]   # the old decode pod


def test_a_recreated_cr_does_not_take_the_deleted_ones_children_for_its_own():
    """A CR deleted and created again under its name: the old CR's children, still there
    until the garbage collector removes them, are not the new CR's revisions, nor its to
    delete; its own appear beside them once applied."""
    from longctx_operator.controller.observe import observe
    fake = FakeCluster()
    deploy(fake)
    steady(fake)
    old = {key for key, o in fake.objects.items() if key[0] != contract.KIND}
    assert old
    fake.objects[(contract.KIND, NS, NAME)]["metadata"]["uid"] = "new-uid"
    snapshot = observe(fake, copy.deepcopy(fake.objects[(contract.KIND, NS, NAME)]),
                       reconcile_module._utcnow())
    owned = [o for key, o in fake.objects.items() if key in old and any(
        r.get("controller") for r in o["metadata"].get("ownerReferences") or [])]
    assert owned and not any((o["kind"], o["metadata"]["name"]) in snapshot.children
                             for o in owned)
    assert snapshot.revisions() == {}
    run(fake)
    assert not [w for w in fake.writes if w[0] == "delete"], fake.writes
