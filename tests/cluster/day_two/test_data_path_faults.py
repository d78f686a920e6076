"""Faults on the data path of the package's real engines, with the fault settings the
operator rendered (`kv_load_failure_policy` fail, NIXL lease 30 s, vllm-router's request
timeout): what the client gets and after how long, what the operator reports, and that
requests are served again once the pod is back. The loopback kubelet restarts a killed
engine (restartPolicy Always).

Each fault lands at a known point of a request:
- prefill lost with the KV decode still has to read: decode is held (SIGSTOP) while the
  router's prefill leg runs, and the prefill engine that served it is SIGKILLed before
  decode resumes;
- decode lost mid-answer: SIGKILL of the decode engine while it streams, with the
  deployment's one decode pod, then with two (decode scaled up for that case and back);
- NIXL side channel unreachable: right after decode's restart, so decode has made no
  handshake yet (an earlier one would let it read the KV without the side channel), the
  prefill engine that ran the prefill legs is stopped (SIGSTOP, at most 20 s) before the
  decode legs.

For each, the operator must post an Event and set the DataPathHealthy condition within
REPORT_SECONDS, naming the pod, the fault and what clients saw, from what it already reads
(pod status, the engines' /metrics).

The cases run in this order; the side channel's requests are the first a (re)started
decode engine serves. Bounded: 24 requests after settling, each at most 300 s.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
from typing import Any

import pytest

from longctx_core import contract
from tests.cluster.day_two.deployment import Figures
from tests.cluster.real_engines import http_json, kv_counters, metric, metrics, words
from tests.cluster.day_two.faults import (
    back, endpoint_counts, first_difference, greedy, in_background, joined, prefill_legs,
    read_kv, reported, restarts, running)
from tests.cluster.sessions import remote_prefill
from tests.cluster.traffic import Outcome, is_ready, served, signal_engine, stream_chat
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

LONG_PROMPT = 1500          # words: about 1,500 tokens, most of maxContextTokens 2048
STOP_SECONDS = 20
# Through the endpoint when decode dies: greedy answers in flight (long enough that the kill
# lands mid-answer: the tiny dense model streams 160 tokens in about a second), and requests
# sent while decode restarts.
ENDPOINT_ANSWERS = 2
ENDPOINT_TOKENS = 1024
DURING_RESTART = 2
# Two decode pods (the second on core 1 beside the first): greedy answers through the
# endpoint on both when one dies, long enough that the kill lands mid-answer.
TWO_DECODES = {"decode": {"replicas": 2}}
ONE_DECODE = {"decode": {"replicas": 1}}
TWO_DECODE_ANSWERS = 3
TWO_DECODE_TOKENS = 256
# A greedy choice whose best two tokens are closer than this (in log-probability, the
# margin of their logits) may flip when the prefix is recomputed instead of decoded token
# by token: the tiny model runs in bf16, which rounds a logit of a few units by hundredths.
NEAR_TIE = 0.1
# The endpoint's give-up window while every engine is stopped (spec.endpoint.continuation).
GIVE_UP_SECONDS = 10
# Each case, its test and what the test requires of the clients (docs/reliability.md).
CASES = [
    ("prefill engine SIGKILLed after its prefill leg, before decode read the KV",
     "test_prefill_lost_before_decode_read_its_kv",
     "straight through the router, the request in flight: an error event within 30 s, no "
     "token; the next one served. Through the endpoint: complete, equal to its no-fault "
     "answer"),
    ("decode engine SIGKILLed mid-answer", "test_decode_lost_mid_answer",
     "straight through the router, the answer in flight cut off within 30 s (no error "
     "event); through the endpoint, every answer complete and equal to its no-fault "
     "answer, the requests sent while decode restarts served by prefill"),
    ("decode engine SIGKILLed mid-answer, two decode pods, requests through the endpoint",
     "test_decode_lost_mid_answer_with_two_decode_pods",
     "nothing: every answer complete, continued by the other decode (its prompt's KV over "
     "NIXL), equal to its no-fault answer unless recomputing the prefix flipped a near tie "
     f"(logit margin under {NEAR_TIE}, recorded)"),
    ("NIXL side channel unreachable (prefill stopped while decode must handshake)",
     "test_nixl_side_channel_unreachable",
     f"straight through the router's legs, the request in flight: an error event within "
     f"{STOP_SECONDS} s, no token; served again within 60 s. Through the endpoint: "
     "complete, equal to its no-fault answer"),
    ("every engine stopped (SIGSTOP), requests through the endpoint",
     "test_every_engine_stopped_the_endpoint_gives_up_within_its_bound",
     "an error event and [DONE], or a 503 with a JSON error, within twice the give-up "
     "window and 10 s"),
]
FIGURES = Figures("data-path-faults", "faults")


def test_prefill_lost_before_decode_read_its_kv(deployment):
    """Straight through the router, the request in flight fails with an error event; the
    same fault under a request through the endpoint, which sends it again once a prefill
    engine is Ready: complete and equal to its no-fault answer."""
    deployment.settle()
    (decode_url,) = deployment.urls("decode").values()
    (decode,) = deployment.pods("decode")
    endpoint = deployment.endpoint()
    through_endpoint = words(LONG_PROMPT, seed=46)
    reference = greedy(endpoint, deployment.model, through_endpoint, 8)
    known = deployment.events()
    failed_before = kv_counters(decode_url)["nixl_failed"]
    signal_engine(decode, signal.SIGSTOP)
    try:
        ((thread, out), (continued, answer)), killed_pods = prefill_legs(deployment, [
            lambda: stream_chat(deployment.router(), deployment.model,
                                words(LONG_PROMPT, seed=41), 8),
            lambda: greedy(endpoint, deployment.model, through_endpoint, 8)])
        for prefill in killed_pods:
            signal_engine(prefill, signal.SIGKILL)
        killed = time.monotonic()
    finally:
        signal_engine(decode, signal.SIGCONT)
    prefill = killed_pods[0]
    got = joined(thread, out)
    waited = time.monotonic() - killed
    case = "prefill lost before decode read its KV"
    FIGURES.record(case, {"error": got.error, "tokens": got.tokens,
                          "client_s_after_kill": round(waited, 1),
                          "nixl_failed": kv_counters(decode_url)["nixl_failed"] - failed_before,
                          "sent": 1, "failed": int(got.failed), "cut_off": 0,
                          "longest_wait_s": round(got.wait, 1)})
    report = reported(deployment, known, killed, ("EngineRestarted", prefill["metadata"]["name"]),
                      ("KVTransferFailed", decode["metadata"]["name"]))
    FIGURES.record(case, report)
    trace, seconds_back = back(deployment, prefill["metadata"]["name"], restarts(prefill))
    FIGURES.record(case, {"status": trace, "back_s": round(seconds_back)})
    through = joined(continued, answer)
    FIGURES.record(f"{case}, through the endpoint", {
        "error": through.error, "tokens": len(through.token_ids),
        "client_s_after_kill": round(time.monotonic() - killed, 1), "sent": 1,
        "failed": int(through.failed), "cut_off": int(len(through.token_ids) < 8),
        "longest_wait_s": round(through.wait, 1),
        "equal_to_no_fault": int(through.token_ids == reference.token_ids)})
    assert "error event" in report["events"][1], report
    assert got.failed and got.tokens == 0, got
    assert waited < 30, f"the client waited {waited:.0f} s after the prefill died"
    assert not through.failed and through.token_ids == reference.token_ids, (through, reference)
    next_one = stream_chat(deployment.router(), deployment.model, words(300, seed=42), 8)
    assert not next_one.failed and next_one.tokens == 8, next_one


def test_decode_lost_mid_answer(deployment):
    """Straight through the router, the answer in flight is cut off. Through the endpoint
    (the deployment's one decode pod is the seed's shape), the answers in flight continue
    on a prefill engine by token ids and equal their no-fault answers, the requests sent
    while decode restarts are served by prefill, and the endpoint goes back to P/D after."""
    deployment.settle()
    (decode_url,) = deployment.urls("decode").values()
    (decode,) = deployment.pods("decode")
    endpoint = deployment.endpoint()
    prompts = [words(120, seed=60 + i) for i in range(ENDPOINT_ANSWERS)]
    no_fault = [greedy(endpoint, deployment.model, p, ENDPOINT_TOKENS) for p in prompts]
    assert all(not o.failed and len(o.token_ids) == ENDPOINT_TOKENS for o in no_fault), no_fault
    counts = endpoint_counts(endpoint)
    known = deployment.events()
    # Long enough that the kill lands mid-answer: decode streams ~30 tokens/s here.
    answer_tokens = 1024
    continued = [in_background(lambda p=p: greedy(endpoint, deployment.model, p,
                                                  ENDPOINT_TOKENS)) for p in prompts]
    thread, out = in_background(lambda: stream_chat(
        deployment.router(), deployment.model, words(200, seed=43), answer_tokens))
    wait_for(lambda: metric(metrics(f"{decode_url}/metrics"),
                            "vllm:num_requests_running") >= 1 + ENDPOINT_ANSWERS, 120,
             "decode to answer", 0.1)
    time.sleep(1)          # a few tokens streamed
    signal_engine(decode, signal.SIGKILL)
    killed = time.monotonic()
    got = joined(thread, out)
    waited = time.monotonic() - killed
    answers = [joined(background, result) for background, result in continued]
    case = "decode lost mid-answer"
    FIGURES.record(case, {"error": got.error, "tokens": got.tokens,
                          "client_s_after_kill": round(waited, 1), "sent": 1,
                          "failed": int(got.failed),
                          "cut_off": int(not got.failed and got.tokens < answer_tokens),
                          "longest_wait_s": round(got.wait, 1)})
    report = reported(deployment, known, killed, ("EngineRestarted", decode["metadata"]["name"]))
    FIGURES.record(case, report)
    assert "without an error event or a finish_reason" in report["events"][0], report
    # New requests while decode restarts: through the endpoint, served by prefill alone.
    during = [greedy(endpoint, deployment.model, words(80, seed=70 + i), 16)
              for i in range(DURING_RESTART)]
    after_fault = endpoint_counts(endpoint)
    trace, seconds_back = back(deployment, decode["metadata"]["name"], restarts(decode))
    FIGURES.record(case, {"status": trace, "back_s": round(seconds_back)})
    assert 0 < got.tokens < answer_tokens, got           # cut off, never complete
    assert waited < 30, f"the client waited {waited:.0f} s after decode died"

    # Back to P/D once decode is Ready again.
    wait_for(lambda: deployment.endpoints(), 60, "the endpoint's pods Ready", 0.5)
    again = greedy(endpoint, deployment.model, words(80, seed=79), 16)
    final = endpoint_counts(endpoint)
    endpoint_case = "decode lost mid-answer, through the endpoint (one decode pod)"
    FIGURES.record(endpoint_case, {
        "sent": len(answers) + len(during) + 1,
        "failed": sum(o.failed for o in [*answers, *during, again]),
        "cut_off": sum(not o.failed and len(o.token_ids) < n for o, n in [
            *((a, ENDPOINT_TOKENS) for a in answers), *((d, 16) for d in during), (again, 16)]),
        "longest_wait_s": round(max(o.wait for o in answers), 1),
        "tokens": sum(len(a.token_ids) for a in answers),
        "equal_to_no_fault": sum(a.token_ids == n.token_ids for a, n in zip(answers, no_fault)),
        "continued": after_fault["continued"] - counts["continued"],
        "served_by_prefill": after_fault["prefill_only"] - counts["prefill_only"],
        "pause_s": round((after_fault["paused_s"] - counts["paused_s"])
                         / max(1.0, after_fault["pauses"] - counts["pauses"]), 2)})
    for answer, reference in zip(answers, no_fault):
        assert not answer.failed and answer.token_ids == reference.token_ids, (
            answer, reference)
        assert answer.text == reference.text
    assert after_fault["continued"] - counts["continued"] == ENDPOINT_ANSWERS
    assert after_fault["given_up"] == counts["given_up"]
    assert all(not d.failed and len(d.token_ids) == 16 for d in during), during
    assert after_fault["prefill_only"] - counts["prefill_only"] >= DURING_RESTART
    assert not again.failed and len(again.token_ids) == 16, again
    assert final["pd"] - after_fault["pd"] == 1 and final["prefill_only"] == \
        after_fault["prefill_only"]


def test_decode_lost_mid_answer_with_two_decode_pods(deployment):
    """Decode scaled to two pods; greedy answers through the endpoint on both, and one
    decode engine SIGKILLed mid-answer: each answer it held is continued through the router
    by the other decode, whose prompt's KV arrives over NIXL (decode computes none of it),
    and equals its no-fault answer, or, where recomputing the prefix flipped a near tie,
    is complete with the margin recorded. The engine killed is the one the scale-down back
    to one pod keeps (ordinal 0) while it holds an answer: its restart is then the fresh
    decode the next case needs. The no-fault answers are taken on that one pod before the
    scale-up, so the other decode holds none of these prompts in its prefix cache."""
    deployment.settle()
    endpoint = deployment.endpoint()
    prompts = [words(120, seed=100 + i) for i in range(TWO_DECODE_ANSWERS)]
    # With logprobs an answer is retried whole, never continued: only the no-fault ones ask.
    references = [in_background(lambda p=p: stream_chat(
        endpoint, deployment.model, p, TWO_DECODE_TOKENS, return_token_ids=True,
        logprobs=True, top_logprobs=2)) for p in prompts]
    no_fault = [joined(thread, out) for thread, out in references]
    assert all(not o.failed and len(o.token_ids) == len(o.margins) == TWO_DECODE_TOKENS
               for o in no_fault), no_fault
    scaling = time.monotonic()
    deployment.apply(TWO_DECODES)
    try:
        deployment.settle()           # both decodes listed and handshaken with each prefill
        scaled_up_s = time.monotonic() - scaling
        decodes = deployment.urls("decode")
        kept, added = sorted(decodes, key=lambda name: int(name.rsplit("-", 1)[1]))
        counts = endpoint_counts(endpoint)
        known = deployment.events()
        answering = [in_background(lambda p=p: greedy(endpoint, deployment.model, p,
                                                       TWO_DECODE_TOKENS)) for p in prompts]
        wait_for(lambda: sum(running(decodes).values()) >= TWO_DECODE_ANSWERS, 120,
                 "both decodes to answer", 0.1)
        time.sleep(1)                 # a few tokens streamed
        held = running(decodes)
        killed_pod, other = (kept, added) if held[kept] else (added, kept)
        before = served(decodes[other]), kv_counters(decodes[other])
        signal_engine(deployment.pod(killed_pod), signal.SIGKILL)
        killed = time.monotonic()
        answers = [joined(thread, out) for thread, out in answering]
        after_fault = endpoint_counts(endpoint)
        after = served(decodes[other]), kv_counters(decodes[other])
        report = reported(deployment, known, killed, ("EngineRestarted", killed_pod))
    finally:
        scaling = time.monotonic()
        deployment.apply(ONE_DECODE)
    deployment.settle(warm=False)     # the pod added is gone, the one killed back
    scaled_down_s = time.monotonic() - scaling
    nixl = {k: after[1][k] - before[1][k] for k in before[1]}
    differed = [d for a, r in zip(answers, no_fault) if (d := first_difference(a, r))]
    FIGURES.record("decode lost mid-answer, through the endpoint (two decode pods)", {
        "sent": len(answers), "failed": sum(a.failed for a in answers),
        "cut_off": sum(not a.failed and len(a.token_ids) < TWO_DECODE_TOKENS for a in answers),
        "longest_wait_s": round(max(a.wait for a in answers), 1),
        "tokens": sum(len(a.token_ids) for a in answers),
        "equal_to_no_fault": sum(a.token_ids == r.token_ids for a, r in zip(answers, no_fault)),
        "continued": after_fault["continued"] - counts["continued"],
        "pause_s": round((after_fault["paused_s"] - counts["paused_s"])
                         / max(1.0, after_fault["pauses"] - counts["pauses"]), 2),
        "answers_on_killed_decode": held[killed_pod],
        "other_decode_requests": after[0][0] - before[0][0],
        "other_decode_prompt_tokens": after[0][1] - before[0][1],
        "other_decode_nixl_tokens": nixl["external_kv_transfer"],
        "other_decode_computed_tokens": nixl["local_compute"],
        "other_decode_cache_hit_tokens": nixl["local_cache_hit"],
        "closest_greedy_choice": round(min(m for r in no_fault for m in r.margins), 4),
        "differed": differed, **report,
        "scale_up_s": round(scaled_up_s), "scale_down_s": round(scaled_down_s)})
    assert sum(held.values()) == TWO_DECODE_ANSWERS and held[killed_pod] >= 1, held
    for answer, reference in zip(answers, no_fault):
        assert not answer.failed and len(answer.token_ids) == TWO_DECODE_TOKENS, answer
        difference = first_difference(answer, reference)
        assert difference is None or difference["margin"] < NEAR_TIE, (difference, answer,
                                                                        reference)
    assert after_fault["continued"] - counts["continued"] == held[killed_pod]
    assert after_fault["given_up"] == counts["given_up"]
    # The other decode finished its own answers and the continued ones, with their prompt
    # (the prompt and the tokens generated before the kill) read over NIXL.
    assert after[0][0] - before[0][0] == sum(held.values()), (before, after)
    assert nixl["local_compute"] == 0 and nixl["nixl_failed"] == 0, nixl
    assert nixl["external_kv_transfer"] > 0, nixl
    assert nixl["external_kv_transfer"] + nixl["local_cache_hit"] == after[0][1] - before[0][1]


def test_nixl_side_channel_unreachable(deployment):
    """Right after a decode (re)start, before any request: decode's first KV read must make
    the NIXL handshake (decode is restarted here unless it has read no KV since it started,
    as after the case above when it killed the decode pod it keeps). Decode is held
    (SIGSTOP) while the router's prefill leg of a request through the endpoint runs and the
    harness sends the prefill leg of another to the same prefill engine; that engine is
    stopped, decode resumes, and both decode legs must handshake with it. Straight through
    the router's legs (the decode leg's stream is what vllm-router passes to the client)
    the request fails; the endpoint's completes, equal to its no-fault answer."""
    deployment.settle(warm=False)
    (decode,) = deployment.pods("decode")
    (decode_url,) = deployment.urls("decode").values()
    if read_kv(decode_url):
        signal_engine(decode, signal.SIGKILL)
        back(deployment, decode["metadata"]["name"], restarts(decode))
    known = deployment.events()
    (decode_url,) = deployment.urls("decode").values()
    (decode,) = deployment.pods("decode")
    assert not read_kv(decode_url), kv_counters(decode_url)
    endpoint = deployment.endpoint()
    counts = endpoint_counts(endpoint)
    failed_before = kv_counters(decode_url)["nixl_failed"]
    prompt, through_endpoint = words(LONG_PROMPT, seed=44), words(LONG_PROMPT, seed=47)
    signal_engine(decode, signal.SIGSTOP)
    try:
        ((continued, answer),), (prefill,) = prefill_legs(deployment, [
            lambda: greedy(endpoint, deployment.model, through_endpoint, 8)])
        params = remote_prefill(deployment.urls("prefill")[prefill["metadata"]["name"]], {
            "model": deployment.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        signal_engine(prefill, signal.SIGSTOP)
    finally:
        signal_engine(decode, signal.SIGCONT)
    try:
        thread, out = in_background(lambda: stream_chat(
            decode_url, deployment.model, prompt, 8, kv_transfer_params=params))
        stopped = time.monotonic()
        thread.join(STOP_SECONDS)
    finally:
        signal_engine(prefill, signal.SIGCONT)
    got = joined(thread, out)
    waited = time.monotonic() - stopped
    case = "NIXL side channel unreachable"
    FIGURES.record(case, {"error": got.error, "tokens": got.tokens,
                          "client_s_after_stop": round(waited, 1),
                          "nixl_failed": kv_counters(decode_url)["nixl_failed"] - failed_before,
                          "sent": 1, "failed": int(got.failed), "cut_off": 0,
                          "longest_wait_s": round(got.wait, 1)})
    FIGURES.record(case, reported(deployment, known, stopped,
                                  ("KVTransferFailed", decode["metadata"]["name"])))
    through = joined(continued, answer)
    through_s = time.monotonic() - stopped
    assert got.failed and got.tokens == 0, got
    assert waited < STOP_SECONDS, f"the client waited {waited:.0f} s for the side channel"
    # Requests right after the prefill resumes may still meet the failed handshake's state:
    # the figure records how many did before one was served through the router.
    attempts: list[Outcome] = []

    def served_again() -> bool:
        attempt = stream_chat(deployment.router(), deployment.model,
                              words(300, seed=45 + len(attempts)), 8)
        attempts.append(attempt)
        return not attempt.failed and attempt.tokens == 8
    started = time.monotonic()
    wait_for(served_again, 60, "a request served after the side channel came back", 1)
    FIGURES.record(case, {"failed_after_resume": len(attempts) - 1,
                          "served_again_s": round(time.monotonic() - started, 1),
                          "errors_after_resume": [a.error for a in attempts[:-1]]})
    reference = greedy(endpoint, deployment.model, through_endpoint, 8)
    after = endpoint_counts(endpoint)
    FIGURES.record(f"{case}, through the endpoint", {
        "error": through.error, "tokens": len(through.token_ids),
        "client_s_after_stop": round(through_s, 1), "sent": 1,
        "failed": int(through.failed), "cut_off": int(len(through.token_ids) < 8),
        "longest_wait_s": round(through.wait, 1),
        "equal_to_no_fault": int(through.token_ids == reference.token_ids),
        "continued": after["continued"] - counts["continued"]})
    assert not through.failed and through.token_ids == reference.token_ids, (through, reference)
    assert after["continued"] - counts["continued"] == 1 and \
        after["given_up"] == counts["given_up"], (counts, after)


def test_every_engine_stopped_the_endpoint_gives_up_within_its_bound(deployment):
    """Every engine stopped (SIGSTOP): a streamed answer through the endpoint ends with an
    error event and `[DONE]`, a non-streamed one is a 503 with a JSON error, within the
    bound: a silent upstream is broken after giveUpSeconds, and the continuations are given
    up giveUpSeconds after that break."""
    deployment.settle(warm=False)
    deployment.apply({"endpoint": {"continuation": {"giveUpSeconds": GIVE_UP_SECONDS}}})

    def rolled() -> bool:
        pods = [p for p in deployment.real.pods(
            deployment.namespace, f"app.kubernetes.io/instance={deployment.name},"
            f"{contract.COMPONENT_LABEL}={contract.ENDPOINT_COMPONENT}")]
        return len(pods) == 2 and all(
            is_ready(p) and str(GIVE_UP_SECONDS) in p["spec"]["containers"][0]["args"]
            for p in pods)
    wait_for(rolled, 180, "the endpoint rolled to the new give-up window", 1)
    endpoint = deployment.endpoint()
    counts = endpoint_counts(endpoint)
    engines = deployment.pods()
    bound = 2 * GIVE_UP_SECONDS + 10
    body = {"model": deployment.model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": words(50, seed=80)}]}

    def non_streamed() -> tuple[int, dict[str, Any]]:
        try:
            return 200, http_json(f"{endpoint}/v1/chat/completions", body, timeout=bound + 30)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
    for pod in engines:
        signal_engine(pod, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        plain: list[tuple[int, dict[str, Any]]] = []
        background = threading.Thread(target=lambda: plain.append(non_streamed()), daemon=True)
        background.start()
        streamed = stream_chat(endpoint, deployment.model, words(50, seed=81), 8,
                               timeout=bound + 30)
        streamed_s = time.monotonic() - stopped
        background.join(bound + 30)
        plain_s = time.monotonic() - stopped
    finally:
        for pod in engines:
            signal_engine(pod, signal.SIGCONT)
    after = endpoint_counts(endpoint)
    ((status, error),) = plain
    FIGURES.record("every engine stopped, through the endpoint", {
        "error": streamed.error, "tokens": streamed.tokens,
        "client_s_after_stop": round(streamed_s, 1), "sent": 2, "failed": 2, "cut_off": 0,
        "non_streamed": f"HTTP {status}", "non_streamed_s": round(plain_s, 1),
        "given_up": after["given_up"] - counts["given_up"]})
    assert streamed.failed and "could not be completed" in streamed.error and streamed.done, \
        streamed
    assert status == 503 and "could not be completed" in error["error"]["message"], error
    assert streamed_s < bound and plain_s < bound, (streamed_s, plain_s)
    assert after["given_up"] - counts["given_up"] == 2
