"""Control-plane faults on the real control plane, each bounded in time: operator SIGKILLs
at random points, a kube-apiserver restart, an etcd pause, a conflict storm, two peered
replicas losing their leader, and a transient admission denial. The operator runs as its
own process (`longctx operator`), so it can be killed and its metrics read. FAULTS is the
table docs/reliability.md shows (tests/reliability_doc.py)."""

from __future__ import annotations

import copy
import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.desired import desired_objects
from tests.cluster.operator_process import OperatorProcess
from tests.cluster.test_reconcile import children
from tests.conftest import REPO, example_cr, wait_for
from tests.figures import Figures

pytestmark = pytest.mark.cluster

SEED = 19
KILLS = 10
DRAIN_SECONDS = 5
ETCD_PAUSE_SECONDS = 5
STORM_SECONDS = 12
STORM_INTERVAL = 0.25
PEERING_LIFETIME = 8
FAULTS = [
    (f"operator SIGKILLed at random points of create, update, rollout and delete (seed {SEED})",
     KILLS, "nothing: exactly the desired children, one pod per replica"),
    ("kube-apiserver restarted, etcd kept", 1,
     "nothing: converged through the watches, the operator not restarted"),
    (f"etcd paused (SIGSTOP) for {ETCD_PAUSE_SECONDS} s", 1,
     "nothing: the operator stayed up and converged after"),
    (f"conflict storm: another field manager rewrites a managed field every {STORM_INTERVAL} s "
     f"for {STORM_SECONDS} s", 1,
     "the field, until the operator restored it; at most one operator write per foreign write"),
    ("2 replicas under Kopf peering, the leader SIGKILLed", 1,
     "nothing: one writer before and after the hand-over"),
    ("a transient ValidatingAdmissionPolicy denial", 1,
     "nothing: retried with backoff, converged with no further touch"),
]
# What each fault measured, by its FAULTS row (docs/reliability.md).
FIGURES = Figures("control-plane-faults", "control-plane")


class Operator(OperatorProcess):
    """The operator under fault: named, optionally peered, watches restarted every 10 s."""

    def __init__(self, cluster, log_dir: Path, name: str = "op", peering: str | None = None):
        super().__init__(cluster.kubeconfig, log_dir / f"operator-{name}.log",
                         args=(f"--peering={peering}",) if peering else (),
                         env={"LONGCTX_WATCH_SERVER_TIMEOUT": "10", "POD_ID": name,
                              "LONGCTX_PEERING_LIFETIME": str(PEERING_LIFETIME)})

    def writes(self, kind: str | None = None) -> float:
        """longctx_api_writes_total, summed (over one kind's), from /metrics."""
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                          timeout=2).read().decode()
        except OSError:
            return -1.0   # not serving yet
        total = 0.0
        for line in text.splitlines():
            if line.startswith("longctx_api_writes_total{") and (
                    kind is None or f'kind="{kind}"' in line):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture
def operators(cluster, tmp_path) -> Iterator[list[Operator]]:
    started: list[Operator] = []
    yield started
    for op in started:
        op.stop()


def converged(cluster, namespace: str, name: str) -> bool:
    cr = cluster.get("lcd", name, namespace) or {}
    status = cr.get("status") or {}
    return (status.get("observedGeneration") == cr.get("metadata", {}).get("generation")
            and status.get("phase") == "Ready")


def expected_children(cluster, namespace: str, name: str) -> set[tuple[str, str]]:
    """What the operator renders for the CR, each role named for the role revision its
    newest StatefulSet runs (a single-pod role replaced beside the serving one keeps its
    replacement's name): a leftover StatefulSet of another role revision is not expected."""
    cr = cluster.get("lcd", name, namespace)
    plan = serving_plan(api.load_spec(cr["spec"]), name)
    sets = sorted(cluster.list("statefulsets", namespace, f"{contract.INSTANCE_LABEL}={name}"),
                  key=lambda s: s["metadata"]["creationTimestamp"])
    plan = plan.with_role_revisions({
        s["metadata"]["labels"][contract.COMPONENT_LABEL]:
            s["metadata"]["labels"].get(contract.ROLE_REVISION_LABEL, plan.revision) for s in sets
        if s["metadata"]["labels"].get(contract.PAIRING_LABEL) == plan.revision})
    return {(o["kind"], o["metadata"]["name"])
            for o in desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=False)}


def assert_exactly_desired(cluster, namespace: str, live: set[str], gone: set[str]) -> None:
    for name in sorted(live):
        found = set(children(cluster, namespace, name))
        expected = expected_children(cluster, namespace, name)
        assert found == expected, (name, found ^ expected)
        spec = cluster.get("lcd", name, namespace)["spec"]
        for role in contract.ROLES:
            pods = [p for p in cluster.list("pods", namespace, f"{contract.INSTANCE_LABEL}={name},"
                                            f"{contract.COMPONENT_LABEL}={role}")
                    if not p["metadata"].get("deletionTimestamp")]
            assert len(pods) == spec.get(role, {}).get("replicas", 1), (name, role, pods)
    for name in sorted(gone):
        assert children(cluster, namespace, name) == {}, name


def picker_configmap(cluster, namespace: str, name: str) -> dict | None:
    return cluster.get("configmap", contract.picker(name), namespace)


def with_lru(cr: dict, value: int) -> dict:
    """A change only the picker's config sees (no engine roll)."""
    cr = copy.deepcopy(cr)
    cr["spec"].setdefault("router", {}).setdefault("prefixCache", {})[
        "lruCapacityPerServer"] = value
    return cr


# ---------------------------------------------------------------- operator SIGKILLs


def test_random_operator_sigkills_end_with_exactly_the_desired_objects(
        cluster, namespace, operators, tmp_path):
    rng = random.Random(SEED)
    live: set[str] = set()
    ops = ["create", "update", "rollout", "delete"]
    started, mid_write = time.monotonic(), 0
    for i in range(KILLS):
        op = Operator(cluster, tmp_path, f"kill-{i}").start()
        operators.append(op)
        time.sleep(rng.uniform(0.0, 1.0))
        action = ops[i % len(ops)] if i < len(ops) else rng.choice(ops)
        name = rng.choice(["ka", "kb"])
        if action == "delete" and name in live:
            cluster.kubectl("delete", "lcd", name, "-n", namespace, "--wait=false")
            live.discard(name)
        else:
            cr = with_lru(example_cr(name), rng.randrange(1000, 40000))
            # kwok's pods report no load, so a swap's old pods drain for the whole window.
            cr["spec"]["rollout"] = {"drainSeconds": DRAIN_SECONDS}
            if action == "rollout":   # the pod template changes, the revision does not
                cr["spec"]["engine"]["engineReadyTimeoutSeconds"] = rng.choice([1800, 2400, 3000])
            assert cluster.apply(cr, namespace).returncode == 0
            live.add(name)
        time.sleep(rng.uniform(0.3, 2.0))
        mid_write += op.writes() > 0   # killed after it had started writing
        op.kill()
    FIGURES.record(FAULTS[0][0], {"kills": KILLS, "seconds": round(time.monotonic() - started),
                                  "after_a_write": mid_write})
    operators.append(Operator(cluster, tmp_path, "final").start())
    begin = time.monotonic()
    for name in sorted(live):
        wait_for(lambda: converged(cluster, namespace, name), 90, f"{name} Ready after kills")
    gone = {"ka", "kb"} - live
    wait_for(lambda: all(children(cluster, namespace, n) == {} for n in gone), 60,
             "the deleted CRs' children collected")
    try:
        wait_for(lambda: _settled(cluster, namespace, live), 60, "pods settled")
    except AssertionError:
        assert_exactly_desired(cluster, namespace, live, gone)   # names what is left
        raise
    FIGURES.record(FAULTS[0][0], {"converged_s": round(time.monotonic() - begin, 1)})
    assert_exactly_desired(cluster, namespace, live, gone)


def _settled(cluster, namespace: str, live: set[str]) -> bool:
    try:
        assert_exactly_desired(cluster, namespace, live, set())
        return True
    except AssertionError:
        return False


# ---------------------------------------------------------------- apiserver and etcd


def test_apiserver_restart_is_recovered_through_the_watches(cluster, namespace, operators,
                                                            tmp_path):
    op = Operator(cluster, tmp_path, "apiserver").start()
    operators.append(op)
    cr = example_cr("ar")
    assert cluster.apply(cr, namespace).returncode == 0
    wait_for(lambda: converged(cluster, namespace, "ar"), 90, "ar Ready")
    pid = op.proc.pid
    cluster.cp.restart_apiserver(down_seconds=3)
    back = time.monotonic()
    # Two things only the watches can tell the operator: a deleted child, a new spec.
    cluster.kubectl("delete", "configmap", contract.picker("ar"), "-n", namespace)
    assert cluster.apply(with_lru(cr, 4242), namespace).returncode == 0
    wait_for(lambda: converged(cluster, namespace, "ar") and "4242" in json.dumps(
        (picker_configmap(cluster, namespace, "ar") or {}).get("data", {})), 60,
        "the child recreated and the new spec applied", interval=0.2)
    took = time.monotonic() - back
    FIGURES.record(FAULTS[1][0], {"converged_s": round(took, 1)})
    assert op.alive and op.proc.pid == pid, "the operator restarted\n" + op.tail()
    assert took < 30


def test_an_etcd_pause_does_not_crash_the_operator(cluster, namespace, operators, tmp_path):
    op = Operator(cluster, tmp_path, "etcd").start()
    operators.append(op)
    cr = example_cr("ep")
    assert cluster.apply(cr, namespace).returncode == 0
    wait_for(lambda: converged(cluster, namespace, "ep"), 90, "ep Ready")
    assert cluster.apply(with_lru(cr, 777), namespace).returncode == 0
    cluster.cp.pause_etcd()
    try:
        time.sleep(ETCD_PAUSE_SECONDS)
    finally:
        cluster.cp.resume_etcd()
    wait_for(lambda: converged(cluster, namespace, "ep") and "777" in json.dumps(
        (picker_configmap(cluster, namespace, "ep") or {}).get("data", {})), 60,
        "converged after the pause")
    assert op.alive, "the operator exited\n" + op.tail()


# ---------------------------------------------------------------- conflict storm


def test_a_conflict_storm_ends_restored_at_a_bounded_write_rate(cluster, namespace, operators,
                                                                tmp_path):
    op = Operator(cluster, tmp_path, "storm").start()
    operators.append(op)
    assert cluster.apply(example_cr("cs"), namespace).returncode == 0
    wait_for(lambda: converged(cluster, namespace, "cs"), 90, "cs Ready")
    name = contract.picker("cs")
    key = next(iter(picker_configmap(cluster, namespace, "cs")["data"]))
    own = picker_configmap(cluster, namespace, "cs")["data"][key]
    wait_for(lambda: op.writes() >= 0, 10, "metrics")
    before = op.writes("ConfigMap")
    foreign = 0
    end = time.monotonic() + STORM_SECONDS
    while time.monotonic() < end:
        patch = json.dumps({"data": {key: f"intruder {foreign}"}})
        cluster.kubectl("patch", "configmap", name, "-n", namespace, "--type=merge",
                        f"--patch={patch}", "--field-manager=intruder")
        foreign += 1
        time.sleep(STORM_INTERVAL)
    wait_for(lambda: picker_configmap(cluster, namespace, "cs")["data"][key] == own, 30,
             "the operator's value restored")
    during = op.writes("ConfigMap") - before
    time.sleep(5)
    after = op.writes("ConfigMap") - before
    per_minute = during * 60 / STORM_SECONDS
    FIGURES.record(FAULTS[3][0], {"foreign_writes": foreign, "operator_writes": round(during),
                                  "per_minute": round(per_minute),
                                  "writes_after": round(after - during)})
    assert 1 <= during <= foreign + 1, (during, foreign)
    assert after == during, "the operator kept writing after the storm"


# ---------------------------------------------------------------- peering


def test_two_peered_replicas_one_writes_and_killing_the_leader_hands_over(
        cluster, namespace, operators, tmp_path):
    peering = f"longctx-ha-{namespace}"
    cluster.kubectl("apply", "--server-side", "-f",
                    str(REPO / "charts" / "longctx" / "crds" / "kopf.dev_peerings.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                    "crd/clusterkopfpeerings.kopf.dev")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
         "metadata": {"name": peering}}))
    try:
        pair = [Operator(cluster, tmp_path, f"replica-{i}", peering).start() for i in (1, 2)]
        operators.extend(pair)
        wait_for(lambda: len((cluster.get("clusterkopfpeering", peering) or {}).get(
            "status", {})) == 2, 30, "both replicas in the peering")
        time.sleep(2)   # each has seen the other and the lower priority paused
        cr = example_cr("ha")
        assert cluster.apply(cr, namespace).returncode == 0
        wait_for(lambda: converged(cluster, namespace, "ha"), 90, "ha Ready")
        writes = [op.writes() for op in pair]
        assert sorted(w > 0 for w in writes) == [False, True], writes
        leader, follower = (pair[0], pair[1]) if writes[0] > 0 else (pair[1], pair[0])
        leader.kill()
        killed = time.monotonic()
        assert cluster.apply(with_lru(cr, 5151), namespace).returncode == 0
        wait_for(lambda: "5151" in json.dumps((picker_configmap(cluster, namespace, "ha") or {})
                                               .get("data", {})), 3 * PEERING_LIFETIME + 20,
                 "the follower took over", interval=0.3)
        FIGURES.record(FAULTS[4][0], {"follower_wrote_s": round(time.monotonic() - killed, 1),
                                      "peering_lifetime_s": PEERING_LIFETIME})
        assert follower.writes() > 0 and follower.alive
        wait_for(lambda: converged(cluster, namespace, "ha"), 30, "ha Ready again")
    finally:
        cluster.kubectl("delete", "clusterkopfpeering", peering, "--wait=false", check=False)


# ---------------------------------------------------------------- admission denial


def test_a_transient_admission_denial_is_retried_with_backoff_and_converges_alone(
        cluster, namespace, operators, tmp_path):
    policy = f"deny-epp-{namespace}"
    deny: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["configmaps"]}]},
                 "validations": [{"expression": "!object.metadata.name.endsWith('-epp')",
                                  "message": "picker config maps are frozen for a drill"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": policy},
               "spec": {"policyName": policy, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": namespace}}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([deny, binding]))
    op = Operator(cluster, tmp_path, "denied").start()
    operators.append(op)
    try:
        # The binding takes effect once the API server's policy informer has it.
        probe = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "probe-epp", "namespace": namespace}}
        wait_for(lambda: cluster.apply(probe, namespace, "--dry-run=server").returncode != 0,
                 30, "the policy in force")
        assert cluster.apply(example_cr("vd"), namespace).returncode == 0
        failures = wait_for(lambda: _retry_delays(cluster, namespace, "vd", 2), 60,
                            "two failed reconciles with their backoff")
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", policy, check=False)
        cluster.kubectl("delete", "validatingadmissionpolicy", policy, check=False)
    lifted = time.monotonic()
    wait_for(lambda: converged(cluster, namespace, "vd"), 90, "converged without a touch")
    FIGURES.record(FAULTS[5][0], {"retry_delays_s": failures,
                                  "converged_s": round(time.monotonic() - lifted, 1)})
    assert failures == sorted(failures) and failures[-1] > failures[0], failures
    assert op.alive


def _retry_delays(cluster, namespace: str, name: str, at_least: int) -> list[int] | None:
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                                        f"--field-selector=involvedObject.name={name}").stdout)
    delays = sorted({int(m.rsplit("retrying in ", 1)[1].split()[0])
                     for e in events["items"] if e.get("reason") == "ReconcileFailed"
                     for m in [e.get("message", "")] if "retrying in" in m})
    return delays if len(delays) >= at_least else None
