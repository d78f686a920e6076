"""Every change a user makes on day two, under a steady stream of requests through
vllm-router, on the package's real engines: none may fail or cut off a request. Each case
records what the clients got (sent, failed, cut off, the longest wait), how long the change
took and what the operator reported (docs/data-path.md's table, generated from the record).

In turn, each under traffic (one request in flight at a time, one a second at most, as
the 2-core machine allows while new engines start; at least 10 per case; bounded in count
and seconds):
1. a scale-down of the prefill role from two pods to one (the pod that leaves drains);
2. an engine image upgrade: a new NIXL pairing key, so a Surge: a new pair starts beside
   the old one, the router switches, the old pair drains;
3. a decode-only and 4. a prefill-only in-place edit with one pod per role: the role's only
   pod is replaced beside the serving one, never restarted in place, and the other role
   keeps its pod (after the decode-only edit, a session begun before it still hits
   prefill's prefix cache);
5. a router edit (its image): the router's Deployment surges its one pod;
   then an endpoint edit (its image), with the traffic through the endpoint's pods: its
   Deployment surges, a leaving pod finishes its answers;
6. a node drain (`kubectl drain` of the decode pod's node, evictions through the
   PodDisruptionBudgets): the single pods and the router move to the other node first;
7. an operator upgrade that renders the engines differently (the operator runs in this
   process: the new rendering stays for the rest of the module);
8. a scale-up of prefill from one pod to two.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from typing import Any, Callable

import pytest

from longctx_core import contract
from longctx_core.plan import faults, roles
from longctx_operator.controller import data_path, desire
from tests.cluster.day_two.deployment import DRAIN_SECONDS, Figures, is_ready
from tests.cluster.day_two.test_prefix_reuse import via_router
from tests.cluster.real_engines import (ENDPOINT_IMAGE_NEXT, ENGINE_IMAGE_NEXT,
                                        ROUTER_IMAGE_NEXT, chat, words)
from tests.cluster.sessions import Session, block_tokens, prefix_counters
from tests.cluster.traffic import PodCounters, ServiceEndpoint, Traffic
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

# An engine start under traffic on the 2 cores, with margin.
PHASE_TIMEOUT = 600
# What the 2 cores allow while two new engines start beside the serving pair.
TRAFFIC_INTERVAL = 1.0
MIN_REQUESTS = 10
# Each change is merged into the spec the one before left (Deployment.apply).
ONE_PREFILL = {"prefill": {"replicas": 1}}
UPGRADED = {"engine": {"image": ENGINE_IMAGE_NEXT}}
DECODE_EDIT = {"engine": {"extraArgs": {"decode": ["--max-num-seqs", "64"]}}}
PREFILL_EDIT = {"engine": {"extraArgs": {"prefill": ["--max-num-seqs", "8"]}}}
ROUTER_EDIT = {"router": {"vllmRouterImage": ROUTER_IMAGE_NEXT}}
ENDPOINT_EDIT = {"endpoint": {"image": ENDPOINT_IMAGE_NEXT}}
TWO_PREFILL = {"prefill": {"replicas": 2}}
NOTHING_LOST = "nothing: no request failed or cut off"
# Each case, its test and what the test requires of the clients (docs/reliability.md).
CASES = [
    ("scale-down of prefill from 2 pods to 1 under traffic", "test_scale_down_under_traffic",
     f"{NOTHING_LOST}, the drain ended early"),
    ("engine image upgrade (Surge) under traffic", "test_engine_image_upgrade_under_traffic",
     f"{NOTHING_LOST}, each answer from one revision's pair"),
    ("decode-only edit, one pod per role, under traffic",
     "test_single_pod_edit_under_traffic[decode-edit0]",
     f"{NOTHING_LOST}: only the decode pod is replaced, beside, never restarted in place; "
     "the prefill pod stays and a session begun before the edit hits its prefix cache"),
    ("prefill-only edit, one pod per role, under traffic",
     "test_single_pod_edit_under_traffic[prefill-edit1]",
     f"{NOTHING_LOST}: only the prefill pod is replaced, beside, never restarted in place; "
     "the decode pod stays"),
    ("router edit (its image) under traffic", "test_router_edit_under_traffic", NOTHING_LOST),
    ("endpoint edit (its image) under traffic through the endpoint",
     "test_endpoint_edit_under_traffic",
     f"{NOTHING_LOST}: new endpoint pods first, the old ones finish their answers"),
    ("node drain (kubectl drain) under traffic", "test_node_drain_under_traffic",
     f"{NOTHING_LOST}: the single pods and the router move first"),
    ("operator upgrade that renders differently, under traffic",
     "test_operator_upgrade_under_traffic", NOTHING_LOST),
    ("scale-up of prefill from 1 pod to 2 under traffic", "test_scale_up_under_traffic",
     NOTHING_LOST),
]
FIGURES = Figures("traffic-rollouts", "traffic")


def revision(pod: dict[str, Any]) -> str:
    return pod["metadata"]["labels"][contract.PAIRING_LABEL]


def conditions(deployment) -> list[str]:
    return [f"{c['type']}={c['status']} {c.get('reason', '')}"
            for c in deployment.status().get("conditions", [])
            if c["type"] in ("Ready", "RolloutBlocked", "Degraded", "DataPathHealthy")]


# The Events the operator posts for a data-path fault, each once (controller/data_path.py).
FAULT_REASONS = {*data_path.FAILURE_COUNTERS.values(), "EngineRestarted", "MissingSeries"}


def new_faults(deployment, known: Counter) -> list[str]:
    """The data-path faults the operator reported since `known` (the CR's Events then). A
    fault an earlier module provoked stays in DataPathHealthy for its window, so the
    condition alone cannot say when a fault began; its one Event can."""
    fresh = Counter(deployment.events()) - known
    return [e[:240] for e in fresh.elements() if e.split(":", 1)[0] in FAULT_REASONS]


def under_traffic(deployment, case: str, change: Callable[[], Any], done: Callable[[], Any],
                  max_requests: int, through: str = contract.ROUTER_COMPONENT
                  ) -> tuple[dict[str, Any], PodCounters]:
    """Starts the traffic (through the router's pods, or the endpoint's) and the per-pod
    counters, makes the change, waits for done() (bounded), stops both; records and returns
    what the clients got, with the counters. A request still open when the traffic stops
    counts as failed."""
    deployment.settle()
    known = Counter(deployment.events())
    real, namespace, name = deployment.real, deployment.namespace, deployment.name
    counters = PodCounters(real, namespace, name).start()
    port = contract.ENDPOINT_PORT if through == contract.ENDPOINT_COMPONENT \
        else contract.VLLM_ROUTER_PORT
    router = ServiceEndpoint(real, namespace, name, component=through, port=port).start()
    traffic = Traffic(router, deployment.model, interval=TRAFFIC_INTERVAL, parallel=1,
                      max_requests=max_requests, max_seconds=PHASE_TIMEOUT).start()
    time.sleep(3)                      # traffic flows before the change
    change()
    changed = time.monotonic()
    faults: list[str] = []             # faults reported since the change began, at each look

    def done_and_healthy() -> Any:
        faults.extend(f for f in new_faults(deployment, known) if f not in faults)
        return done()
    try:
        wait_for(done_and_healthy, PHASE_TIMEOUT, case, 1)
        took = time.monotonic() - changed
        # However quick the change, the case sees MIN_REQUESTS answers.
        wait_for(lambda: len(traffic.outcomes) >= MIN_REQUESTS, 60,
                 f"{MIN_REQUESTS} requests answered")
    finally:
        traffic.stop()
        router.stop()
        counters.stop()
    summary = {**traffic.summary(), "seconds": round(took),
               "events": [e[:240] for e in (Counter(deployment.events()) - known).elements()],
               "conditions": conditions(deployment)}
    summary["data_path_faults"] = faults + [f for f in new_faults(deployment, known)
                                            if f not in faults]
    FIGURES.record(case, summary)
    return summary, counters


def assert_one_revision_per_answer(counters: PodCounters) -> None:
    """Per revision, what its prefill pods prefilled equals what its decode pods decoded,
    in requests and prompt tokens: every prompt is distinct in length, so a request
    prefilled by one revision and decoded by another would unbalance both."""
    by_rev = counters.by_revision()
    for rev, roles_ in by_rev.items():
        assert roles_.get("prefill", (0, 0)) == roles_.get("decode", (0, 0)), by_rev


def assert_none_lost(summary: dict[str, Any]) -> None:
    """No request failed or cut off, and the operator saw no data-path fault throughout."""
    assert summary["sent"] >= MIN_REQUESTS and summary["failed"] == 0 \
        and summary["cut_off"] == 0, summary
    assert not summary["data_path_faults"], summary


def settled_on_new(deployment, old: str) -> Callable[[], bool]:
    def check() -> bool:
        s = deployment.status()
        pods = deployment.pods()
        return (s.get("rollout") or {}).get("phase") == "Steady" and \
            s.get("revision") != old and {revision(p) for p in pods} == {s.get("revision")} \
            and all(map(is_ready, pods))
    return check


def settled_without(deployment, gone: set[str]) -> Callable[[], bool]:
    """Nothing rolling, one pairing key, every pod Ready, and none of the pods `gone`
    (by uid) left."""
    def check() -> bool:
        s = deployment.status()
        pods = deployment.pods()
        return (s.get("rollout") or {}).get("phase") == "Steady" and \
            {revision(p) for p in pods} == {s.get("revision")} and all(map(is_ready, pods)) \
            and not gone & uids(pods) and len(pods) == len(contract.ROLES)
    return check


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def started(summary: dict[str, Any]) -> str:
    (message,) = [e for e in summary["events"] if e.startswith("RolloutStarted")]
    return message


def test_scale_down_under_traffic(deployment):
    assert len(deployment.pods("prefill")) == 2

    def one_prefill() -> bool:
        pods = deployment.pods()
        return len(pods) == 2 and not any(p["metadata"].get("deletionTimestamp") for p in pods)
    summary, counters = under_traffic(deployment, "scale-down of prefill from 2 pods to 1",
                                      lambda: deployment.apply(ONE_PREFILL), one_prefill,
                                      max_requests=200)
    assert_none_lost(summary)
    assert_one_revision_per_answer(counters)
    assert any(e.startswith("ScaleDownDrained") for e in summary["events"]), summary["events"]
    assert summary["seconds"] < DRAIN_SECONDS, "the drain took its whole window"


def test_engine_image_upgrade_under_traffic(deployment):
    old = deployment.status()["revision"]
    summary, counters = under_traffic(
        deployment, "engine image upgrade (a new pairing key: Surge)",
        lambda: deployment.apply(UPGRADED), settled_on_new(deployment, old), max_requests=1000)
    FIGURES.record("engine image upgrade (a new pairing key: Surge)",
                   {"by_revision": counters.by_revision()})
    assert_none_lost(summary)
    assert_one_revision_per_answer(counters)
    served = counters.by_revision()
    assert len(served) == 2 and all(r.get("decode", (0, 0))[0] > 0 for r in served.values()), \
        served   # both revisions served
    drained = [e for e in summary["events"] if e.startswith("RolloutDrained")]
    # The drain ended on idle engines, long before its window.
    assert drained and "held no request" in drained[-1], summary["events"]


@pytest.mark.parametrize("role,edit", [("decode", DECODE_EDIT), ("prefill", PREFILL_EDIT)])
def test_single_pod_edit_under_traffic(deployment, role, edit):
    """Only the edited role's pod is replaced (one new engine starts); the other role's pod
    serves on throughout, and prefill's prefix cache with it."""
    (other,) = set(contract.ROLES) - {role}
    deployment.settle()
    key = deployment.status()["revision"]
    before = {r: uids(deployment.pods(r)) for r in contract.ROLES}
    assert all(len(b) == 1 for b in before.values()), before
    session = Session(seed=4000)
    session.ask(1)
    first = via_router(deployment.router(), session.body(deployment.model))
    summary, counters = under_traffic(
        deployment, f"{role}-only edit, one pod per role (replaced beside)",
        lambda: deployment.apply(edit), settled_without(deployment, before[role]),
        max_requests=1000)
    assert_none_lost(summary)
    assert_one_revision_per_answer(counters)
    started(summary)   # one rollout started; its whole message (the record cuts it):
    message = [e for e in deployment.events() if e.startswith("RolloutStarted")][-1]
    assert f"{role} has one pod (spec.{role}.replicas = 1) and its pod template changes" in \
        message and f"{other} keeps its pods" in message, message
    assert uids(deployment.pods(other)) == before[other]
    assert deployment.status()["revision"] == key
    # One engine started: the edited role's; the other's pod never restarted.
    assert set(counters.last) - before[role] - before[other] == uids(deployment.pods(role))
    if role == "decode":
        # The session's next turn finds its first turn's prefix on the prefill pod.
        (prefill,) = deployment.urls("prefill").values()
        block = block_tokens(prefill)
        queries, hits = prefix_counters(prefill)
        session.messages.append({"role": "assistant",
                                 "content": first["choices"][0]["message"]["content"]})
        session.ask(2)
        via_router(deployment.router(), session.body(deployment.model))
        after = prefix_counters(prefill)
        cached = first["usage"]["prompt_tokens"] // block * block
        FIGURES.record(f"{role}-only edit, one pod per role (replaced beside)", {
            "next_turn": {"queries": after[0] - queries, "hits": after[1] - hits,
                          "first_turn_prompt_tokens": first["usage"]["prompt_tokens"]}})
        # vLLM caches whole blocks: the first turn's are all hits.
        assert after[1] - hits >= cached > 0, (after, (queries, hits), cached)


def test_router_edit_under_traffic(deployment):
    def router_rolled() -> bool:
        pods = deployment.real.pods(deployment.namespace,
                                    f"app.kubernetes.io/instance={deployment.name},"
                                    f"{contract.COMPONENT_LABEL}={contract.ROUTER_COMPONENT}")
        return len(pods) == 1 and is_ready(pods[0]) and \
            pods[0]["spec"]["containers"][0]["image"] == ROUTER_IMAGE_NEXT
    summary, _ = under_traffic(deployment, "router edit (its image)",
                               lambda: deployment.apply(ROUTER_EDIT), router_rolled,
                               max_requests=300)
    assert_none_lost(summary)


def test_endpoint_edit_under_traffic(deployment):
    """The endpoint's own rollout, with the clients on its pods: it surges, and a leaving
    pod finishes its answers in flight."""
    def endpoint_rolled() -> bool:
        pods = deployment.real.pods(deployment.namespace,
                                    f"app.kubernetes.io/instance={deployment.name},"
                                    f"{contract.COMPONENT_LABEL}={contract.ENDPOINT_COMPONENT}")
        return len(pods) == 2 and all(is_ready(p) and p["spec"]["containers"][0]["image"]
                                      == ENDPOINT_IMAGE_NEXT for p in pods)
    deployment.endpoint()
    summary, _ = under_traffic(deployment, "endpoint edit (its image)",
                               lambda: deployment.apply(ENDPOINT_EDIT), endpoint_rolled,
                               max_requests=300, through=contract.ENDPOINT_COMPONENT)
    assert_none_lost(summary)


def test_node_drain_under_traffic(deployment):
    (decode,) = deployment.pods("decode")
    node = decode["spec"]["nodeName"]
    cp = deployment.real.cp
    router_nodes = {p["spec"]["nodeName"] for p in deployment.real.pods(
        deployment.namespace, f"app.kubernetes.io/instance={deployment.name},"
                              f"{contract.COMPONENT_LABEL}={contract.ROUTER_COMPONENT}")}
    drain: list[subprocess.Popen] = []

    def drain_node() -> None:
        drain.append(subprocess.Popen(
            [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig), "drain", node,
             "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={PHASE_TIMEOUT}s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    on_node = uids([p for p in deployment.pods() if p["spec"]["nodeName"] == node])

    def drained() -> bool:
        return drain[0].poll() is not None and settled_without(deployment, on_node)()
    try:
        summary, counters = under_traffic(deployment, f"node drain (kubectl drain {node})",
                                          drain_node, drained, max_requests=1000)
        out = drain[0].communicate()[0]
    finally:
        if drain and drain[0].poll() is None:
            drain[0].kill()
        cp.kubectl("uncordon", node, check=False)
    assert drain[0].returncode == 0, out
    assert_none_lost(summary)
    assert_one_revision_per_answer(counters)
    assert f"on node {node}, which is being drained" in started(summary), summary["events"]
    if node in router_nodes:
        assert any(e.startswith("RouterMoving") for e in summary["events"]), summary["events"]
    assert all(p["spec"]["nodeName"] != node for p in deployment.pods())


@pytest.fixture(scope="module")
def operator_upgrade() -> Any:
    """Makes the in-process operator render as its next build would: a recalibrated NIXL
    lease for the same spec. Undone when the module ends (the last of the package)."""
    patch = pytest.MonkeyPatch()

    def upgrade() -> None:
        patch.setattr(faults, "VLLM_DEFAULT_LEASE_SECONDS",
                      faults.VLLM_DEFAULT_LEASE_SECONDS + 15)
        roles._priced.cache_clear()
        # The next build is a new process, which holds no plan the old one made: from now
        # on the operator plans into an empty memory of plans (desire.SpecPlans).
        fresh, of = desire.SpecPlans(), desire.SpecPlans.of
        patch.setattr(desire.SpecPlans, "of", lambda _old, cr, nodes: of(fresh, cr, nodes))
    yield upgrade
    patch.undo()
    roles._priced.cache_clear()


def test_operator_upgrade_under_traffic(deployment, operator_upgrade):
    """Both single-pod roles are replaced beside the serving ones, and the status names
    the operator as the cause."""
    old = uids(deployment.pods())

    def upgrade() -> None:
        operator_upgrade()
        # Any event reconciles the CR; the spec and its generation stay as they are.
        deployment.real.cp.kubectl("annotate", "lcd", deployment.name, "-n",
                                   deployment.namespace, "longctx.dev/test-nudge=upgrade",
                                   "--overwrite")
    summary, counters = under_traffic(deployment, "operator upgrade that renders differently",
                                      upgrade, settled_without(deployment, old),
                                      max_requests=1000)
    assert_none_lost(summary)
    assert_one_revision_per_answer(counters)
    cause = deployment.status()["rolloutCause"]
    assert cause["cause"] == "operator" and "decode" in cause["roles"], cause
    deployment.settle()
    assert chat(deployment.router(), deployment.model, words(80, seed=7), 8)


def test_scale_up_under_traffic(deployment, operator_upgrade):
    def two_prefill() -> bool:
        pods = deployment.pods("prefill")
        return len(pods) == 2 and all(map(is_ready, pods))
    summary, _ = under_traffic(deployment, "scale-up of prefill from 1 pod to 2",
                               lambda: deployment.apply(TWO_PREFILL), two_prefill,
                               max_requests=500)
    assert_none_lost(summary)
