"""The endpoint against a local upstream that streams like vLLM and breaks its streams
(fake_vllm.py): answers continued by token ids equal their no-fault answers, the bounds
give up with an error event or a 503, and the metrics count what happened."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Optional

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from longctx_endpoint import relay
from longctx_endpoint.relay import Limits
from longctx_endpoint.server import make_app
from longctx_endpoint.upstreams import Pod, Upstreams
from tests.endpoint.fake_vllm import FakeVllm, Fault, no_fault_answer, prompt_ids, text_of

LIMITS = Limits(max_attempts=3, give_up_seconds=5, backoff_seconds=0.01)
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}],
             "max_tokens": 12, "temperature": 0, "stream": True}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _run(fake: FakeVllm, body: dict[str, Any], path: str, limits: Limits,
               upstreams: Optional[Upstreams] = None) -> tuple[int, Any]:
    async with TestServer(fake.app()) as upstream:
        upstreams = upstreams or Upstreams(router_url=str(upstream.make_url("")).rstrip("/"))
        async with TestServer(make_app(upstreams, limits)) as endpoint:
            async with aiohttp.ClientSession() as client:
                async with client.post(endpoint.make_url(path), json=body) as resp:
                    if body.get("stream") and resp.status == 200:
                        events = [json.loads(line[5:]) if line[5:].strip() != b"[DONE]"
                                  else "[DONE]" async for line in resp.content
                                  if line.startswith(b"data:")]
                        return resp.status, events
                    return resp.status, await resp.json()


def run(fake: FakeVllm, body: dict[str, Any], path: str = "/v1/chat/completions",
        limits: Limits = LIMITS, upstreams: Optional[Upstreams] = None) -> tuple[int, Any]:
    return asyncio.run(_run(fake, body, path, limits, upstreams))


def streamed_text(events: list[Any]) -> str:
    out = []
    for e in events:
        for c in (e.get("choices") or []) if isinstance(e, dict) else []:
            out.append((c.get("delta") or {}).get("content") or c.get("text") or "")
    return "".join(out)


def expected(limit: int = 12, text: str = "hello") -> str:
    return "".join(map(text_of, no_fault_answer(prompt_ids(text), limit)))


@pytest.mark.parametrize("fault", [Fault("cut", 5), Fault("no_finish", 4), Fault("error", 0),
                                   Fault("cut", 0), Fault("status", status=503)])
def test_a_broken_chat_stream_continues_with_the_no_fault_answer(fault: Fault) -> None:
    continued = sample("longctx_endpoint_answers_continued_total")
    fake = FakeVllm(faults=[fault])
    status, events = run(fake, CHAT_BODY)
    assert status == 200
    assert streamed_text(events) == expected()
    assert events[-1] == "[DONE]"
    finishes = [c["finish_reason"] for e in events if isinstance(e, dict)
                for c in e["choices"] if c.get("finish_reason")]
    assert finishes == ["length"]
    # One role chunk, no token ids the client did not ask for.
    assert sum("role" in c.get("delta", {}) for e in events[:-1] for c in e["choices"]) == 1
    assert not any("token_ids" in c or "prompt_token_ids" in e
                   for e in events[:-1] for c in e["choices"])
    assert sample("longctx_endpoint_answers_continued_total") == continued + 1
    # Continued by token ids once the prompt's are known, with what is left of max_tokens.
    kind, second = fake.requests[1]
    if fault.kind in ("cut", "no_finish") and fault.after:
        assert kind == "completion" and second["prompt"][:5] == prompt_ids("hello")
        assert second["max_tokens"] == 12 - fault.after and second["temperature"] == 0


def test_a_non_streamed_answer_is_continued_and_usage_counts_the_whole_answer() -> None:
    fake = FakeVllm(faults=[Fault("cut", 7)])
    status, body = run(fake, {**CHAT_BODY, "stream": False, "return_token_ids": True})
    assert status == 200
    choice = body["choices"][0]
    assert choice["message"]["content"] == expected()
    assert choice["finish_reason"] == "length"
    assert choice["token_ids"] == no_fault_answer(prompt_ids("hello"), 12)
    assert body["prompt_token_ids"] == prompt_ids("hello")
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}


def test_a_completions_stream_keeps_its_usage_and_token_ids_when_asked() -> None:
    fake = FakeVllm(faults=[Fault("cut", 3), Fault("cut", 2)])
    status, events = run(fake, {"model": "m", "prompt": "hello", "max_tokens": 9,
                                "stream": True, "return_token_ids": True,
                                "stream_options": {"include_usage": True}}, "/v1/completions")
    assert status == 200 and streamed_text(events) == expected(9)
    ids = [t for e in events[:-2] for c in e["choices"] for t in c["token_ids"]]
    assert ids == no_fault_answer(prompt_ids("hello"), 9)
    assert events[-2]["usage"]["completion_tokens"] == 9
    assert len({e["id"] for e in events[:-1]}) == 1


def test_the_end_of_an_upstream_body_is_read_so_that_its_connection_serves_the_next() -> None:
    fake = FakeVllm(tail_seconds=0.05)

    async def twice() -> list[Any]:
        async with TestServer(fake.app()) as upstream:
            upstreams = Upstreams(router_url=str(upstream.make_url("")).rstrip("/"))
            async with TestServer(make_app(upstreams, LIMITS)) as endpoint:
                async with aiohttp.ClientSession() as client:
                    return [await (await client.post(endpoint.make_url("/v1/chat/completions"),
                                                     json={**CHAT_BODY, "stream": False})
                                   ).json() for _ in range(2)]
    answers = asyncio.run(twice())
    assert [a["choices"][0]["message"]["content"] for a in answers] == [expected()] * 2
    assert len(fake.peers) == 1


def test_an_upstream_that_holds_its_body_open_after_the_finish_does_not_hold_the_answer(
        monkeypatch) -> None:
    monkeypatch.setattr(relay, "TAIL_SECONDS", 0.2)
    started = time.monotonic()
    status, events = run(FakeVllm(tail_seconds=2), CHAT_BODY)
    assert time.monotonic() - started < 1
    assert status == 200 and streamed_text(events) == expected() and events[-1] == "[DONE]"


def test_a_stream_that_cannot_continue_ends_with_an_error_event_and_done() -> None:
    given_up = sample("longctx_endpoint_answers_given_up_total", reason="attempts_exhausted")
    fake = FakeVllm(faults=[Fault("cut", 3)] + [Fault("status", status=503)] * 5)
    started = time.monotonic()
    status, events = run(fake, CHAT_BODY)
    assert time.monotonic() - started < LIMITS.give_up_seconds
    assert status == 200 and events[-1] == "[DONE]"
    assert "error" in events[-2] and "attempts exhausted" in events[-2]["error"]["message"]
    assert len(fake.requests) == 1 + LIMITS.max_attempts
    assert sample("longctx_endpoint_answers_given_up_total",
                  reason="attempts_exhausted") == given_up + 1


def test_a_non_streamed_answer_that_cannot_continue_is_a_503_with_a_json_error() -> None:
    fake = FakeVllm(faults=[Fault("status", status=503)] * 10)
    status, body = run(fake, {**CHAT_BODY, "stream": False},
                       limits=Limits(max_attempts=50, give_up_seconds=0.5,
                                     backoff_seconds=0.05))
    assert status == 503 and "time exhausted" in body["error"]["message"]


def test_a_client_error_is_passed_on() -> None:
    status, body = run(FakeVllm(), {**CHAT_BODY, "max_tokens": -1, "stream": False})
    assert status == 400 and body["error"]["message"] == "max_tokens < 0"


def test_what_cannot_be_continued_is_retried_from_scratch_until_the_client_got_a_byte() -> None:
    body = {**CHAT_BODY, "n": 2}
    fake = FakeVllm(faults=[Fault("error", 0)])
    status, events = run(fake, body)
    assert status == 200 and streamed_text(events) == expected()
    assert [r[1] for r in fake.requests] == [body, body]   # passed as it is, twice
    fake = FakeVllm(faults=[Fault("cut", 4)])
    status, events = run(fake, body)
    assert "cannot be continued exactly: n or best_of" in events[-2]["error"]["message"]
    assert events[-1] == "[DONE]"


def _pods(*specs: tuple[str, str, bool]) -> list[Pod]:
    return [Pod(f"{component}-{i}", component, "rev1", ip, ready, True)
            for i, (component, ip, ready) in enumerate(specs)]


def test_with_no_decode_ready_the_answer_goes_to_a_prefill_engine_and_is_counted() -> None:
    """The seed's one-decode shape: the attempt goes to the prefill engine's port."""
    async def scenario() -> tuple[int, Any, FakeVllm]:
        fake = FakeVllm()
        async with TestServer(fake.app()) as prefill:
            upstreams = Upstreams(router_url="http://127.0.0.1:9", engine_port=prefill.port)
            upstreams.replace(_pods(("decode", "127.0.0.1", False),
                                    ("prefill", "127.0.0.1", True)))
            async with TestServer(make_app(upstreams, LIMITS)) as endpoint:
                async with aiohttp.ClientSession() as client:
                    async with client.post(endpoint.make_url("/v1/chat/completions"),
                                           json={**CHAT_BODY, "stream": False}) as resp:
                        return resp.status, await resp.json(), fake
    before = sample("longctx_endpoint_requests_total", route="prefill_only")
    status, body, fake = asyncio.run(scenario())
    assert status == 200 and body["choices"][0]["message"]["content"] == expected()
    assert sample("longctx_endpoint_requests_total", route="prefill_only") == before + 1


def test_the_metrics_page_names_every_series() -> None:
    async def scenario() -> str:
        async with TestServer(make_app(Upstreams(router_url="http://127.0.0.1:9"),
                                       LIMITS)) as endpoint:
            async with aiohttp.ClientSession() as client:
                async with client.get(endpoint.make_url("/metrics")) as resp:
                    return await resp.text()
    page = asyncio.run(scenario())
    for name in ("longctx_endpoint_requests_total", "longctx_endpoint_answers_continued_total",
                 "longctx_endpoint_continuation_attempts_total",
                 "longctx_endpoint_continuation_pause_seconds_bucket",
                 "longctx_endpoint_answers_given_up_total"):
        assert name in page


def test_with_nowhere_to_send_it_waits_without_spending_attempts_then_gives_up() -> None:
    async def scenario() -> tuple[int, Any, int, float]:
        fake = FakeVllm()
        async with TestServer(fake.app()) as prefill:
            upstreams = Upstreams(engine_port=prefill.port)   # no pod seen yet
            limits = Limits(max_attempts=1, give_up_seconds=2, backoff_seconds=0.01)
            async with TestServer(make_app(upstreams, limits)) as endpoint:
                async with aiohttp.ClientSession() as client:
                    async def later() -> None:
                        await asyncio.sleep(0.5)
                        upstreams.replace(_pods(("prefill", "127.0.0.1", True)))
                    appear = asyncio.create_task(later())
                    async with client.post(endpoint.make_url("/v1/chat/completions"),
                                           json={**CHAT_BODY, "stream": False}) as resp:
                        served = resp.status, await resp.json()
                    await appear
                    upstreams.replace([])
                    started = time.monotonic()
                    async with client.post(endpoint.make_url("/v1/chat/completions"),
                                           json={**CHAT_BODY, "stream": False}) as resp:
                        return (*served, resp.status, time.monotonic() - started)
    status, body, later_status, waited = asyncio.run(scenario())
    assert status == 200 and body["choices"][0]["message"]["content"] == expected()
    assert later_status == 503 and 2 <= waited < 3


def test_a_client_that_leaves_mid_answer_ends_its_answer_quietly() -> None:
    async def scenario() -> int:
        fake = FakeVllm()
        async with TestServer(fake.app()) as upstream:
            upstreams = Upstreams(router_url=str(upstream.make_url("")).rstrip("/"))
            async with TestServer(make_app(upstreams, LIMITS)) as endpoint:
                async with aiohttp.ClientSession() as client:
                    async with client.post(endpoint.make_url("/v1/chat/completions"),
                                           json={**CHAT_BODY, "max_tokens": 5000}) as resp:
                        await resp.content.readline()
                    await asyncio.sleep(0.5)
                    async with client.post(endpoint.make_url("/v1/chat/completions"),
                                           json={**CHAT_BODY, "stream": False}) as resp:
                        return resp.status
    before = sample("longctx_endpoint_answers_given_up_total", reason="attempts_exhausted")
    assert asyncio.run(scenario()) == 200     # the endpoint serves on
    assert sample("longctx_endpoint_answers_given_up_total",
                  reason="attempts_exhausted") == before
