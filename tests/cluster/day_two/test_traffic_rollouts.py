"""A scale-down, a Surge rollout and a decode-only edit under a steady stream of requests
through vllm-router, on the package's real engines: what the clients got (failed, cut off,
the longest wait), that every answer came from one revision's pair, and that a drain ends
once the draining pods hold no request (the window is 300 s, so an early end shows).

In turn, each under traffic (one request in flight at a time, one every 0.2 s at most, as
the 2-core machine allows while new engines start; at least 10 per case; bounded in count
and seconds):
1. a scale-down of the prefill role from two pods to one (the pod that leaves drains);
2. a Surge rollout (a pairing flag changes): a new prefill/decode pair starts beside the
   old one, the router switches, the old pair drains;
3. a decode-only in-place edit (one decode pod: it restarts).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.cluster.day_two.deployment import DRAIN_SECONDS, Figures, is_ready
from tests.cluster.real_engines import chat, words
from tests.cluster.traffic import PodCounters, RouterEndpoint, Traffic
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

# An engine start under traffic on the 2 cores, with margin.
PHASE_TIMEOUT = 600
# What the 2 cores allow while two new engines start beside the serving pair.
TRAFFIC_INTERVAL = 0.2
MIN_REQUESTS = 10
ONE_PREFILL = {"prefill": {"replicas": 1}}
# The CPU backend's own block size for the dense model, pinned: a new pairing key.
SURGE = {**ONE_PREFILL, "engine": {"extraArgs": {"prefill": ["--block-size", "128"],
                                                 "decode": ["--block-size", "128"]}}}
DECODE_EDIT = {**ONE_PREFILL, "engine": {"extraArgs": {
    "prefill": ["--block-size", "128"],
    "decode": ["--block-size", "128", "--max-num-seqs", "64"]}}}
# Each case, its test and what the test requires of the clients (docs/reliability.md).
CASES = [
    ("scale-down of prefill from 2 pods to 1 under traffic", "test_scale_down_under_traffic",
     "nothing: no request failed or cut off, the drain ended early"),
    ("Surge rollout under traffic", "test_surge_rollout_under_traffic",
     "nothing: no request failed or cut off, each answer from one revision's pair"),
    ("decode-only in-place edit under traffic (one decode pod)",
     "test_decode_only_in_place_edit_under_traffic",
     "the requests in flight while decode restarts (counted, not required); served after"),
]
FIGURES = Figures("traffic-rollouts", "traffic")


def under_traffic(deployment, case: str, edit: dict[str, Any], done: Any,
                  max_requests: int) -> tuple[dict[str, Any], PodCounters]:
    """Starts the traffic and the per-pod counters, applies `edit`, waits for done()
    (bounded), stops both; returns what the clients got and the counters."""
    deployment.settle()
    known = set(deployment.events())
    real, namespace, name = deployment.real, deployment.namespace, deployment.name
    counters = PodCounters(real, namespace, name).start()
    router = RouterEndpoint(real, namespace, name).start()
    traffic = Traffic(router, deployment.model, interval=TRAFFIC_INTERVAL, parallel=1,
                      max_requests=max_requests, max_seconds=PHASE_TIMEOUT).start()
    time.sleep(3)                      # traffic flows before the edit
    deployment.apply(edit)
    edited = time.monotonic()
    try:
        wait_for(done, PHASE_TIMEOUT, case, 1)
        took = time.monotonic() - edited
        # However quick the change, the case sees MIN_REQUESTS answers.
        wait_for(lambda: len(traffic.outcomes) >= MIN_REQUESTS, 60,
                 f"{MIN_REQUESTS} requests answered")
    finally:
        traffic.stop()
        router.stop()
        counters.stop()
    summary = {**traffic.summary(), "seconds": round(took),
               "events": [e[:200] for e in deployment.events() if e not in known]}
    FIGURES.record(case, summary)
    return summary, counters


def assert_one_revision_per_answer(counters: PodCounters) -> None:
    """Per revision, what its prefill pods prefilled equals what its decode pods decoded,
    in requests and prompt tokens: every prompt is distinct in length, so a request
    prefilled by one revision and decoded by another would unbalance both."""
    by_rev = counters.by_revision()
    for rev, roles in by_rev.items():
        assert roles.get("prefill", (0, 0)) == roles.get("decode", (0, 0)), by_rev


def assert_none_failed(summary: dict[str, Any]) -> None:
    assert summary["sent"] >= MIN_REQUESTS and summary["failed"] == 0 \
        and summary["cut_off"] == 0, summary


def test_scale_down_under_traffic(deployment):
    assert len(deployment.pods("prefill")) == 2

    def one_prefill() -> bool:
        pods = deployment.pods()
        return len(pods) == 2 and not any(p["metadata"].get("deletionTimestamp") for p in pods)
    summary, counters = under_traffic(deployment, "scale-down 2 to 1 prefill pods",
                                      ONE_PREFILL, one_prefill, max_requests=200)
    assert_none_failed(summary)
    assert_one_revision_per_answer(counters)
    drained = [e for e in summary["events"] if e.startswith("ScaleDownDrained")]
    assert drained, summary["events"]
    assert summary["seconds"] < DRAIN_SECONDS, "the drain took its whole window"


def test_surge_rollout_under_traffic(deployment):
    old = deployment.status()["revision"]

    def steady_on_new() -> bool:
        s = deployment.status()
        revs = {p["metadata"]["labels"]["longctx.dev/pairing"] for p in deployment.pods()}
        return (s.get("rollout") or {}).get("phase") == "Steady" and \
            s.get("revision") != old and revs == {s.get("revision")}
    summary, counters = under_traffic(deployment, "Surge rollout", SURGE, steady_on_new,
                                      max_requests=1000)
    FIGURES.record("Surge rollout", {"by_revision": counters.by_revision()})
    assert_none_failed(summary)
    assert_one_revision_per_answer(counters)
    served = counters.by_revision()
    assert len(served) == 2 and all(roles.get("decode", (0, 0))[0] > 0
                                    for roles in served.values()), served   # both served
    drained = [e for e in summary["events"] if e.startswith("RolloutDrained")]
    # The drain ended on idle engines, long before its window.
    assert drained and "held no request" in drained[-1], summary["events"]
    assert deployment.status()["rollout"].get("switchTime")


def test_decode_only_in_place_edit_under_traffic(deployment):
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in deployment.pods()}

    def decode_replaced() -> bool:
        pods = {p["metadata"]["name"]: p for p in deployment.pods()}
        changed = {n for n, p in pods.items() if before.get(n) != p["metadata"]["uid"]}
        return all(map(is_ready, pods.values())) and len(pods) == 2 and len(changed) == 1 \
            and "decode" in next(iter(changed))
    summary, _ = under_traffic(deployment, "decode-only in-place edit", DECODE_EDIT,
                               decode_replaced, max_requests=500)
    assert summary["sent"] >= MIN_REQUESTS, summary
    # The one decode pod restarts: what the clients got meanwhile is measured, not
    # required; the prefill pod was not restarted and the answers after it are whole.
    deployment.settle()
    assert chat(deployment.router(), deployment.model, words(80, seed=7), 8)
