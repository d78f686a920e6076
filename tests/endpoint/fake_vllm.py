"""A local aiohttp server that streams like vLLM's OpenAI server with `return_token_ids`
(vllm/entrypoints/openai/{chat_completion,completion}/serving.py: the chat stream's first
chunk carries the role and `prompt_token_ids`, a completions stream's first choice carries
`prompt_token_ids`, every choice its `token_ids`, a last chunk the usage; compact JSON, its
fields in the order of vLLM's pydantic models), and breaks its streams the ways engines do. Its "model" is greedy and deterministic: the next token is a
function of every token before it, so a continuation from the right token ids gives the
same answer and one from wrong ids does not."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from aiohttp import web

FIRST_TOKEN = 100


def next_token(ids: list[int]) -> int:
    return FIRST_TOKEN + (sum(ids) * 7 + len(ids)) % 50


def text_of(token: int) -> str:
    return f" w{token}"


def prompt_ids(text: str) -> list[int]:
    return [ord(c) % 90 + 10 for c in text]


@dataclass
class Fault:
    """How one request is served: cut (connection closed) after `after` tokens, an in-stream
    error after them (vLLM's "Internal server error" before the first token), an end
    without a finish reason, or an HTTP status."""

    kind: str            # "cut", "error", "no_finish", "status"
    after: int = 0
    status: int = 503


@dataclass
class FakeVllm:
    faults: list[Optional[Fault]] = field(default_factory=list)   # by request, in order
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tail_seconds: float = 0.0    # from a stream's finish reason to its usage chunk
    token_seconds: float = 0.0   # before each streamed token
    peers: set[Any] = field(default_factory=set)   # the connections requests came on

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = prompt_ids("".join(m["content"] for m in body["messages"]))
        return await self._serve(request, "chat", body, prompt)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body["prompt"]
        prompt = prompt if isinstance(prompt, list) else prompt_ids(prompt)
        return await self._serve(request, "completion", body, prompt)

    async def _serve(self, request: web.Request, kind: str, body: dict[str, Any],
                     prompt: list[int]) -> web.StreamResponse:
        self.requests.append((kind, body))
        self.peers.add(request.transport.get_extra_info("peername"))
        fault = self.faults.pop(0) if self.faults else None
        if fault and fault.kind == "status":
            return web.json_response({"error": {"message": "down"}}, status=fault.status)
        if body.get("max_tokens", 0) < 0:
            return web.json_response({"error": {"message": "max_tokens < 0"}}, status=400)
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        ids = body.get("return_token_ids")
        tokens: list[int] = []
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        base = {"id": f"{kind}-{len(self.requests)}", "object": obj,
                "created": len(self.requests), "model": body.get("model", "m")}
        if not body.get("stream"):
            while len(tokens) < limit:
                tokens.append(next_token(prompt + tokens))
            return web.json_response({**base, "choices": [
                {"index": 0, "text": "".join(map(text_of, tokens)), "finish_reason": "length"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(chunk: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps({**base, **chunk}, separators=(",", ":"))
                             .encode() + b"\n\n")
        if kind == "chat":
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}],
                        "prompt_token_ids": prompt if ids else None})
        while len(tokens) < limit:
            if fault and len(tokens) == fault.after:
                if fault.kind == "cut":
                    request.transport.close()
                    return resp
                if fault.kind == "error":
                    await send({"error": {"message": "Internal server error", "code": 500}})
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
                if fault.kind == "no_finish":
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
            await asyncio.sleep(self.token_seconds)
            token = next_token(prompt + tokens)
            tokens.append(token)
            finish = "length" if len(tokens) == limit else None
            choice: dict[str, Any] = {"index": 0}
            if kind == "chat":
                choice.update(delta={"content": text_of(token)}, logprobs=None,
                              finish_reason=finish)
                if finish:
                    choice["stop_reason"] = None
            else:
                choice.update(text=text_of(token), logprobs=None, finish_reason=finish,
                              stop_reason=None,
                              prompt_token_ids=prompt if len(tokens) == 1 and ids else None)
            choice["token_ids"] = [token] if ids else None
            await send({"choices": [choice]})
        await asyncio.sleep(self.tail_seconds)
        await send({"choices": [], "usage": {"prompt_tokens": len(prompt),
                                             "completion_tokens": len(tokens)}})
        await resp.write(b"data: [DONE]\n\n")
        return resp


def no_fault_answer(prompt: list[int], limit: int) -> list[int]:
    tokens: list[int] = []
    while len(tokens) < limit:
        tokens.append(next_token(prompt + tokens))
    return tokens
