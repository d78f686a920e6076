"""The endpoint's server on SIGTERM (server.serve): the answers in flight finish, for at most
the drain window, while new connections are refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time

import aiohttp
from aiohttp.test_utils import TestServer

from longctx_endpoint.relay import Limits
from longctx_endpoint.server import make_app, serve
from longctx_endpoint.upstreams import Upstreams
from tests.endpoint.fake_vllm import FakeVllm, no_fault_answer, prompt_ids, text_of

LIMITS = Limits(max_attempts=3, give_up_seconds=5, backoff_seconds=0.01)
TOKENS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _stream_then_sigterm(drain_seconds: float) -> tuple[str, bool, float, bool]:
    """A 20-token answer at 50 ms a token, SIGTERM after its first token: its text, whether
    it ended with [DONE], how long serve() took after the signal, and whether a new
    connection was refused meanwhile."""
    fake = FakeVllm(token_seconds=0.05)
    async with TestServer(fake.app()) as upstream:
        port = _free_port()
        app = make_app(Upstreams(router_url=str(upstream.make_url("")).rstrip("/")), LIMITS)
        server = asyncio.create_task(serve(app, "127.0.0.1", port, drain_seconds))
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": TOKENS, "temperature": 0, "stream": True}
        text, done, refused, signalled = [], False, False, 0.0
        async with aiohttp.ClientSession() as client:
            for _ in range(100):
                try:
                    async with client.get(f"http://127.0.0.1:{port}/health"):
                        break
                except aiohttp.ClientConnectorError:
                    await asyncio.sleep(0.05)
            try:
                async with client.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                       json=body) as resp:
                    async for line in resp.content:
                        if line.startswith(b"data: [DONE]"):
                            done = True
                        elif line.startswith(b"data:"):
                            for c in json.loads(line[5:])["choices"]:
                                text.append((c.get("delta") or {}).get("content") or "")
                        if "".join(text) and not signalled:
                            signalled = time.monotonic()
                            os.kill(os.getpid(), signal.SIGTERM)
                            await asyncio.sleep(0.1)
                            try:
                                async with aiohttp.ClientSession() as other:
                                    await other.get(f"http://127.0.0.1:{port}/health")
                            except aiohttp.ClientConnectorError:
                                refused = True
            except aiohttp.ClientPayloadError:
                pass   # cut at the end of the drain window
        await asyncio.wait_for(server, 10)
        return "".join(text), done, time.monotonic() - signalled, refused


def test_sigterm_lets_the_answers_in_flight_finish_and_refuses_new_connections() -> None:
    text, done, took, refused = asyncio.run(_stream_then_sigterm(drain_seconds=10))
    assert text == "".join(map(text_of, no_fault_answer(prompt_ids("hello"), TOKENS)))
    assert done and refused
    assert took < 5, f"serve() returned {took:.1f} s after SIGTERM, long after its answer"


def test_the_drain_ends_at_its_window() -> None:
    _, done, took, _ = asyncio.run(_stream_then_sigterm(drain_seconds=0.3))
    assert not done, "the answer outlasting the drain window should have been cut"
    assert took < 1.8, f"serve() returned {took:.1f} s after SIGTERM, its window was 0.3 s"
