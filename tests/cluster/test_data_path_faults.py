"""Faults on the data path of real engines, with the fault settings the operator rendered
(`kv_load_failure_policy` fail, NIXL lease 30 s, vllm-router's request timeout): what the
client gets and after how long, what the operator reports, and that the next request
succeeds once the pod is back. One CPU deployment for the module (40-120 s to start), each
fault on it in turn; the loopback kubelet restarts a killed engine (restartPolicy Always).

- prefill lost with the KV decode still has to read: decode is held (SIGSTOP) while the
  prefill leg runs, the prefill engine is SIGKILLed once it answered, decode resumes;
- decode lost mid-answer: SIGKILL of the decode engine while it streams;
- NIXL side channel unreachable: decode restarted (so it must handshake again), prefill
  stopped (SIGSTOP) right after its prefill leg, so the handshake gets no answer.

Bounded: 8 requests, each at most 300 s; every stop lasts at most 20 s.
"""

from __future__ import annotations

import json
import sys
import signal
import threading
import time
from typing import Any, Callable

import pytest

from tests.cluster.real_engines import (RealEngines, chat, cpu_cr, kv_counters, metric,
                                        metrics, words)
from tests.cluster.traffic import Outcome, served, signal_engine, stream_chat
from tests.conftest import REPO, SESSION_DIR, wait_for

pytestmark = pytest.mark.cluster

NAMESPACE = "dp-faults"
NAME = "faults"
MODEL = "tiny-mla"
LONG_PROMPT = 1500          # words: about 1,500 tokens, most of maxContextTokens 2048
# An engine restart took 4-5 min under a load average of 15, over 6 min at 40.
RESTART_TIMEOUT = 600
FIGURES: dict[str, dict[str, Any]] = {}
# Kept after the session (its directory is removed): the figures docs/data-path.md quotes.
FIGURES_DIR = REPO / ".pytest_cache"


def record(case: str, figures: dict[str, Any]) -> None:
    FIGURES[case] = figures
    report(f"{case}: {json.dumps(figures)}")


def report(line: str) -> None:
    """To the terminal: the in-process operator's runner captures sys.stdout meanwhile."""
    sys.__stdout__.write(f"\n[faults] {line}\n")
    sys.__stdout__.flush()
    FIGURES_DIR.mkdir(exist_ok=True)
    (FIGURES_DIR / "data-path-faults.json").write_text(json.dumps(FIGURES, indent=1))


@pytest.fixture(scope="module")
def engines(cluster, operator):
    with RealEngines(cluster.cp, SESSION_DIR / "dp-faults", octet=140) as real:
        real.prepare_namespace(NAMESPACE)
        real.apply(cpu_cr(NAME), NAMESPACE)
        started = time.monotonic()
        real.wait_ready(NAME, NAMESPACE)
        report(f"Ready in {time.monotonic() - started:.0f} s")
        # The first request makes the NIXL handshake; the faults start from a warm pair.
        assert chat(real.endpoints(NAME, NAMESPACE).router, MODEL, words(50), 4)
        try:
            yield real
        finally:
            report(json.dumps(FIGURES))
            cluster.kubectl("delete", "lcd", NAME, "-n", NAMESPACE, "--wait=false",
                            check=False)
            wait_for(lambda: not real.pods(NAMESPACE, f"app.kubernetes.io/instance={NAME}"),
                     120, "the engine pods to stop")


def engine_pod(engines: RealEngines, role: str) -> dict[str, Any]:
    (pod,) = engines.pods(NAMESPACE, f"app.kubernetes.io/instance={NAME},"
                                     f"app.kubernetes.io/component={role}")
    return pod


def restarts(pod: dict[str, Any]) -> int:
    return sum(cs.get("restartCount", 0)
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def in_background(fn: Callable[[], Outcome]) -> tuple[threading.Thread, list[Outcome]]:
    out: list[Outcome] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def after_prefill_leg(url: str, before: float, timeout: float = 120) -> float:
    """Waits until the prefill engine finished one more request (the router's prefill leg
    of the request in flight); returns when."""
    wait_for(lambda: served(url)[0] > before, timeout, "the prefill leg to finish", 0.05)
    return time.monotonic()


def status_while(engines: RealEngines, done: Callable[[], bool], timeout: float
                 ) -> list[str]:
    """The CR's Ready and Degraded conditions, each change, until done()."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conds = {c["type"]: c for c in (engines.lcd(NAME, NAMESPACE).get("status") or {})
                 .get("conditions", [])}
        line = ", ".join(f"{t}={conds[t]['status']} ({conds[t].get('reason', '')})"
                         for t in ("Ready", "Degraded") if t in conds)
        if not seen or seen[-1] != line:
            seen.append(line)
        if done():
            return seen
        time.sleep(1)
    raise AssertionError(f"not back after {timeout:.0f} s; status went {seen}\n"
                         + engines.pod_logs(NAMESPACE))


def back(engines: RealEngines, role: str, before: int) -> tuple[list[str], float]:
    """The role's pod restarted and Ready again: the CR's conditions meanwhile, and how
    long it took."""
    started = time.monotonic()

    def ready() -> bool:
        pod = engine_pod(engines, role)
        return restarts(pod) > before and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod["status"].get("conditions", []))
    trace = status_while(engines, ready, RESTART_TIMEOUT)
    wait_for(lambda: (engines.lcd(NAME, NAMESPACE).get("status") or {}).get("phase")
             == "Ready", 60, "the CR Ready again")
    return trace, time.monotonic() - started


def cr_events(engines: RealEngines) -> list[str]:
    """The Events the operator posted on the CR: "reason: message"."""
    out = engines.cp.kubectl("get", "events", "-n", NAMESPACE, "-o", "json",
                             "--field-selector", f"involvedObject.name={NAME}")
    return [f"{e['reason']}: {e['message']}"[:160] for e in json.loads(out.stdout)["items"]]


def test_prefill_lost_before_decode_read_its_kv(engines):
    ends = engines.endpoints(NAME, NAMESPACE)
    prefill, decode = engine_pod(engines, "prefill"), engine_pod(engines, "decode")
    known = set(cr_events(engines))
    before, failed_before = served(ends.prefill)[0], kv_counters(ends.decode)["nixl_failed"]
    signal_engine(decode, signal.SIGSTOP)
    try:
        thread, out = in_background(lambda: stream_chat(ends.router, MODEL,
                                                        words(LONG_PROMPT, seed=41), 8))
        after_prefill_leg(ends.prefill, before)
        signal_engine(prefill, signal.SIGKILL)
        killed = time.monotonic()
    finally:
        signal_engine(decode, signal.SIGCONT)
    thread.join(300)
    got = out[0]
    waited = time.monotonic() - killed
    case = "prefill lost before decode read its KV"
    record(case, {"error": got.error, "tokens": got.tokens,
                  "client_s_after_kill": round(waited, 1),
                  "nixl_failed": kv_counters(ends.decode)["nixl_failed"] - failed_before})
    trace, seconds_back = back(engines, "prefill", restarts(prefill))
    record(case, {**FIGURES[case], "status": trace, "back_s": round(seconds_back),
                  "events": [e for e in cr_events(engines) if e not in known]})
    assert got.failed and got.tokens == 0, got
    assert waited < 30, f"the client waited {waited:.0f} s after the prefill died"
    next_one = stream_chat(ends.router, MODEL, words(300, seed=42), 8)
    assert not next_one.failed and next_one.tokens == 8, next_one


def test_decode_lost_mid_answer(engines):
    ends = engines.endpoints(NAME, NAMESPACE)
    decode = engine_pod(engines, "decode")
    known = set(cr_events(engines))
    # Long enough that the kill lands mid-answer: decode streams ~30 tokens/s here.
    answer_tokens = 1024
    thread, out = in_background(lambda: stream_chat(ends.router, MODEL, words(200, seed=43),
                                                    answer_tokens))
    wait_for(lambda: metric(metrics(f"{ends.decode}/metrics"),
                            "vllm:num_requests_running") >= 1, 120, "decode to answer", 0.1)
    time.sleep(1)          # a few tokens streamed
    signal_engine(decode, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(300)
    got = out[0]
    waited = time.monotonic() - killed
    case = "decode lost mid-answer"
    record(case, {"error": got.error, "tokens": got.tokens,
                  "client_s_after_kill": round(waited, 1)})
    trace, seconds_back = back(engines, "decode", restarts(decode))
    record(case, {**FIGURES[case], "status": trace, "back_s": round(seconds_back),
                  "events": [e for e in cr_events(engines) if e not in known]})
    assert got.tokens < answer_tokens, got           # never a complete answer
    assert waited < 30, f"the client waited {waited:.0f} s after decode died"


def test_nixl_side_channel_unreachable(engines):
    """Runs right after decode's restart: its first request must handshake with prefill."""
    ends = engines.endpoints(NAME, NAMESPACE)
    prefill = engine_pod(engines, "prefill")
    before, failed_before = served(ends.prefill)[0], kv_counters(ends.decode)["nixl_failed"]
    thread, out = in_background(lambda: stream_chat(ends.router, MODEL,
                                                    words(LONG_PROMPT, seed=44), 8))
    after_prefill_leg(ends.prefill, before)
    signal_engine(prefill, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        thread.join(20)
    finally:
        signal_engine(prefill, signal.SIGCONT)
    thread.join(300)
    got = out[0]
    waited = time.monotonic() - stopped
    case = "NIXL side channel unreachable"
    record(case, {
        "error": got.error, "tokens": got.tokens, "client_s_after_stop": round(waited, 1),
        "nixl_failed": kv_counters(ends.decode)["nixl_failed"] - failed_before})
    assert got.failed and got.tokens == 0, got
    assert waited < 20, f"the client waited {waited:.0f} s with the side channel stopped"
    # Requests right after the prefill resumes may still meet the failed handshake's state:
    # the figure records how many did before one was served.
    attempts = []

    def served_again() -> bool:
        attempt = stream_chat(ends.router, MODEL, words(300, seed=45 + len(attempts)), 8)
        attempts.append(attempt)
        return not attempt.failed and attempt.tokens == 8
    resumed = time.monotonic()
    wait_for(served_again, 60, "a request served after the side channel came back", 1)
    record(case, {**FIGURES[case], "failed_after_resume": len(attempts) - 1,
                  "served_again_s": round(time.monotonic() - resumed, 1),
                  "errors_after_resume": [a.error for a in attempts[:-1]]})
