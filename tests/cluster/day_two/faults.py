"""What the data-path fault cases (test_data_path_faults.py) observe and wait for: the
operator's report of a fault, an engine pod's restart, requests run in the background, the
endpoint's counters and an answer's first difference from its no-fault answer."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

from tests.cluster.real_engines import kv_counters, metric, metrics
from tests.cluster.traffic import Outcome, served, stream_chat
from tests.conftest import wait_for

# From the fault to the operator's Event: the engine watch reads every 5 s, a restart shows
# in the pod status the kubelet writes.
REPORT_SECONDS = 30
# An engine restart took 4-5 min under a load average of 15, over 6 min at 40.
RESTART_TIMEOUT = 600


def reported(deployment, known: list[str], since: float, *wanted: tuple[str, str]
             ) -> dict[str, Any]:
    """Waits for a new Event of each (reason, pod) in `wanted` and the DataPathHealthy
    condition False; returns the events, the condition and how long the reports took."""
    def found() -> list[str] | None:
        new = list((Counter(deployment.events()) - Counter(known)).elements())
        hits = [next((e for e in new if e.startswith(f"{reason}:") and pod in e), None)
                for reason, pod in wanted]
        cond = next((c for c in deployment.status().get("conditions", [])
                     if c["type"] == "DataPathHealthy"), {})
        return hits if all(hits) and cond.get("status") == "False" else None
    hits = wait_for(found, REPORT_SECONDS, f"the operator's report of {wanted}", 0.5)
    took = time.monotonic() - since
    cond = next(c for c in deployment.status()["conditions"] if c["type"] == "DataPathHealthy")
    return {"events": [e[:240] for e in hits], "reported_s": round(took, 1),
            "conditions": [f"DataPathHealthy=False {cond['reason']}"]}


def restarts(pod: dict[str, Any]) -> int:
    return sum(cs.get("restartCount", 0)
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def in_background(fn: Callable[[], Outcome]) -> tuple[threading.Thread, list[Outcome]]:
    out: list[Outcome] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: list[Outcome]) -> Outcome:
    """What a request started by in_background got (it has 300 s)."""
    thread.join(300)
    (outcome,) = out
    return outcome


def prefill_legs(deployment, requests: list[Callable[[], Outcome]]
                 ) -> tuple[list[tuple[threading.Thread, list[Outcome]]], list[dict[str, Any]]]:
    """Long streamed requests with decode held: returns once a prefill engine finished the
    leg of each, with those prefill pods (decode is still stopped)."""
    prefills = deployment.urls("prefill")
    before = {pod: served(url)[0] for pod, url in prefills.items()}
    started = [in_background(request) for request in requests]

    def legs_done() -> list[str] | None:
        assert all(t.is_alive() or not o for t, o in started), \
            f"a request ended first: {[o for _, o in started]}"
        after = {pod: served(url)[0] for pod, url in prefills.items()}
        if sum(after.values()) - sum(before.values()) < len(requests):
            return None
        return [pod for pod in prefills if after[pod] > before[pod]]
    names = wait_for(legs_done, 120, "the prefill legs to finish", 0.05)
    return started, [deployment.pod(name) for name in names]


def back(deployment, name: str, before: int) -> tuple[list[str], float]:
    """Pod `name` restarted and Ready again, and the CR Ready: the CR's Ready and Degraded
    conditions at each change meanwhile, and how long it took."""
    started = time.monotonic()
    seen: list[str] = []

    def ready_again() -> bool:
        conds = {c["type"]: c for c in deployment.status().get("conditions", [])}
        line = ", ".join(f"{t}={conds[t]['status']} ({conds[t].get('reason', '')})"
                         for t in ("Ready", "Degraded") if t in conds)
        if not seen or seen[-1] != line:
            seen.append(line)
        pod = deployment.pod(name)
        return restarts(pod) > before and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod["status"].get("conditions", []))
    wait_for(ready_again, RESTART_TIMEOUT, f"{name} restarted and Ready", 1)
    deployment.settle(warm=False)
    return seen, time.monotonic() - started


def endpoint_counts(url: str) -> dict[str, float]:
    """The endpoint pod's counters (longctx_endpoint/metrics.py)."""
    page = metrics(f"{url}/metrics")
    return {"pd": metric(page, "longctx_endpoint_requests_total", route="pd"),
            "prefill_only": metric(page, "longctx_endpoint_requests_total",
                                   route="prefill_only"),
            "continued": metric(page, "longctx_endpoint_answers_continued_total"),
            "given_up": metric(page, "longctx_endpoint_answers_given_up_total"),
            "pauses": metric(page, "longctx_endpoint_continuation_pause_seconds_count"),
            "paused_s": metric(page, "longctx_endpoint_continuation_pause_seconds_sum")}


def greedy(url: str, model: str, prompt: str, tokens: int) -> Outcome:
    return stream_chat(url, model, prompt, tokens, return_token_ids=True)


def running(urls: dict[str, str]) -> dict[str, float]:
    """The requests each engine (pod: URL) is generating for."""
    return {pod: metric(metrics(f"{url}/metrics"), "vllm:num_requests_running")
            for pod, url in urls.items()}


def first_difference(answer: Outcome, reference: Outcome) -> dict[str, float] | None:
    """Where an answer's greedy choice first differs from its no-fault answer, and by what
    margin the no-fault answer chose there (reference.margins: top_logprobs 2)."""
    at = next((i for i, (got, want) in enumerate(zip(answer.token_ids, reference.token_ids))
               if got != want), None)
    return None if at is None else {"token": at, "margin": round(reference.margins[at], 4)}


def read_kv(decode_url: str) -> bool:
    """Whether a decode engine has read KV (or tried to) since it started: its NIXL
    handshakes are made then."""
    counters = kv_counters(decode_url)
    return counters["nixl_transfers"] + counters["nixl_failed"] > 0

