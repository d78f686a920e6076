"""One client answer through its attempts: sent upstream, continued after a break, given up
within the bounds (spec.endpoint.continuation).

An attempt is broken when its stream fails or is cut (`stream_broken`), ends without a
finish reason (`no_finish_reason`), fails before its first token (`failed_before_first_token`:
vLLM's in-stream error when a prefill engine or its KV transfer was lost), or finds no
upstream (`upstream_unreachable`). The next attempt continues by token ids
(openai.continuation_request) after a back-off, through the router, or through a prefill
engine when no decode is Ready (upstreams.py); while there is no Ready router or engine at
all it waits, spending no attempt. An answer is given up when its attempts are spent or when
giveUpSeconds passed since the break that is still unresolved (a continuation that delivers
a token resolves it). A streamed answer then ends with an error event and
`[DONE]`; a non-streamed one is a 503 with a JSON error body.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Union

import aiohttp
from aiohttp import web

from longctx_endpoint import metrics
from longctx_endpoint.openai import (CHAT, COMPLETION, DONE, PATHS, Answer, error_body,
                                     read_chunk, sse, why_not_continuable)
from longctx_endpoint.upstreams import PD, Target, Upstreams


@dataclass(frozen=True)
class Limits:
    max_attempts: int        # continuation attempts per answer
    give_up_seconds: float   # from a break to giving up, unless a token came
    backoff_seconds: float = 0.5   # before the first continuation; doubles each time


@dataclass(frozen=True)
class Refused:
    """An upstream answer that is not a server fault (a 4xx): the client's to see."""

    status: int
    body: bytes
    content_type: str


class ClientGone(Exception):
    """The client closed its connection: nothing more to send or continue."""

    def __init__(self, response: Optional[web.StreamResponse]):
        super().__init__("the client closed its connection")
        self.response = response


class ClientStream:
    """The client's SSE response. Its headers go out as soon as an upstream has answered 200
    (`open`), while the first token is still being computed, so that preparing them is not
    on the first token's path; `started` once a byte of the body was sent."""

    def __init__(self, request: web.Request):
        self.request = request
        self.response: Optional[web.StreamResponse] = None
        self.started = False
        self.held: list[bytes] = []

    async def open(self) -> web.StreamResponse:
        if self.response is None:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
            try:
                await response.prepare(self.request)
            except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
                raise ClientGone(None) from exc
            self.response = response
        return self.response

    def hold(self, data: bytes) -> None:
        """Keeps `data` for the next write."""
        self.held.append(data)

    async def flush(self) -> None:
        if self.held:
            data, self.held = b"".join(self.held), []
            await self.send(data)

    async def send(self, data: bytes) -> None:
        response = await self.open()
        self.started = True
        try:
            await response.write(data)
        except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone(response) from exc

    async def end(self, data: bytes = b"") -> web.StreamResponse:
        """Sends what is held, the last `data` and the end of the body, in one write."""
        data, self.held = b"".join((*self.held, data)), []
        response = await self.open()
        self.started = True
        try:
            await response.write_eof(data)
        except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone(response) from exc
        return response


Outcome = Union[None, str, Refused]   # finished, a break's reason, or a refusal
# How often an answer with nowhere to go looks again (the pod watch's news).
TARGET_POLL_SECONDS = 0.25
# How long the end of an upstream body may take after its finish reason.
TAIL_SECONDS = 1.0


class Breaks:
    """The attempts of one answer and its unresolved break, against the limits."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.attempts = 0
        self.since: Optional[float] = None     # the unresolved break
        self.pause_from: Optional[float] = None

    def deadline(self) -> Optional[float]:
        return None if self.since is None else self.since + self.limits.give_up_seconds

    def token_sent(self) -> None:
        if self.pause_from is not None:
            metrics.PAUSE.observe(time.monotonic() - self.pause_from)
        self.since = self.pause_from = None

    def broke(self) -> float:
        """Marks a break (unless one is unresolved); the time now."""
        now = time.monotonic()
        self.since = self.since or now
        self.pause_from = self.pause_from or now
        return now

    async def next_attempt(self, reason: str) -> Optional[str]:
        """Waits out the back-off before the next attempt; why to give up instead."""
        now = self.broke()
        if self.attempts >= self.limits.max_attempts:
            return metrics.ATTEMPTS_EXHAUSTED
        delay = self.limits.backoff_seconds * 2 ** self.attempts
        if now + delay >= self.since + self.limits.give_up_seconds:
            return metrics.TIME_EXHAUSTED
        await asyncio.sleep(delay)
        self.attempts += 1
        metrics.ATTEMPTS.labels(reason).inc()
        return None


def _give_up_message(reason: str, last: str, breaks: Breaks) -> str:
    return (f"the answer could not be completed: {reason.replace('_', ' ')} after "
            f"{breaks.attempts} continuation attempt(s) (last failure: {last.replace('_', ' ')})")


def _upstream_kind(path: str) -> str:
    return CHAT if path == PATHS[CHAT] else COMPLETION


def _status_reason(status: int) -> str:
    return (metrics.UPSTREAM_UNREACHABLE if status in (502, 503, 504)
            else metrics.FAILED_BEFORE_FIRST_TOKEN)


async def _events(content: aiohttp.StreamReader) -> AsyncIterator[list[bytes]]:
    """The data of an upstream stream's server-sent events, as each read brought them."""
    rest = b""   # an event not yet whole
    while data := await content.readany():
        *events, rest = (rest + data).split(b"\n\n")
        yield [event[5:].strip() for event in events if event.startswith(b"data:")]


def _opening(line: bytes) -> Optional[bool]:
    """Whether a line of a stream that has sent no token yet still opens it (a blank line,
    a chat's role chunk); None: it is an error, the attempt failed before its first token."""
    if not line.startswith(b"data:"):
        return True
    data = line[5:].strip()
    if data == b"[DONE]":
        return False
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    if "error" in chunk:
        return None
    return not any((c.get("delta") or {}).get("content") or c.get("text")
                   or c.get("finish_reason") for c in chunk.get("choices") or [])


class Relay:
    def __init__(self, session: aiohttp.ClientSession, upstreams: Upstreams, limits: Limits):
        self.session, self.upstreams, self.limits = session, upstreams, limits

    async def _target(self, first: bool, breaks: Breaks) -> Optional[Target]:
        """Where the next attempt goes. While there is nowhere (no Ready router or engine),
        it waits, spending no attempt, until the give-up window closes (None)."""
        target = self.upstreams.target()
        if target is None:
            breaks.broke()
            while target is None and time.monotonic() < breaks.deadline():
                await asyncio.sleep(TARGET_POLL_SECONDS)
                target = self.upstreams.target()
        if first:
            metrics.REQUESTS_BY_ROUTE[target.route if target else PD].inc()
        return target

    async def _no_target(self, stream: Optional[ClientStream], breaks: Breaks
                         ) -> web.StreamResponse:
        return await self._give_up(stream, metrics.TIME_EXHAUSTED, _give_up_message(
            metrics.TIME_EXHAUSTED, metrics.UPSTREAM_UNREACHABLE, breaks))

    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response(error_body("the request body is not JSON", 400,
                                                "BadRequestError"), status=400)
        if not isinstance(body, dict):
            return web.json_response(error_body("the request body is not a JSON object",
                                                400, "BadRequestError"), status=400)
        try:
            if why_not_continuable(body) is None:
                return await self.continued(request, kind, body)
            return await self.retried(request, kind, body)
        except ClientGone as gone:   # its response, as far as it went
            return gone.response or web.Response(status=499)

    # ------------------------------------------------------------ continued by token ids

    async def continued(self, request: web.Request, kind: str,
                        body: dict[str, Any]) -> web.StreamResponse:
        answer = Answer(kind, body)
        stream = ClientStream(request) if answer.streamed else None
        breaks = Breaks(self.limits)
        first = True
        while True:
            target = await self._target(first, breaks)
            if target is None:
                return await self._no_target(stream, breaks)
            upstream = answer.next_request()
            path = PATHS[kind] if answer.prompt_token_ids is None else PATHS[COMPLETION]
            outcome = await self._attempt(target.url + path, upstream, _upstream_kind(path),
                                          answer, stream, breaks)
            first = False
            if outcome is None or (isinstance(outcome, str) and answer.length_reached()):
                if answer.finish_reason is None:
                    answer.finish_reason = "length"
                if breaks.attempts:
                    metrics.CONTINUED.inc()
                return await self._finish(answer, stream)
            if isinstance(outcome, Refused):
                if stream is None or not stream.started:
                    if breaks.attempts == 0:
                        return web.Response(body=outcome.body, status=outcome.status,
                                            content_type=outcome.content_type)
                return await self._give_up(stream, metrics.REFUSED, _give_up_message(
                    metrics.REFUSED, f"HTTP {outcome.status}", breaks))
            give_up = await breaks.next_attempt(outcome)
            if give_up:
                return await self._give_up(stream, give_up,
                                           _give_up_message(give_up, outcome, breaks))

    async def _attempt(self, url: str, upstream: dict[str, Any], upstream_kind: str,
                       answer: Answer, stream: Optional[ClientStream], breaks: Breaks
                       ) -> Outcome:
        got_token = broken = finished = ended = False
        deadline = breaks.deadline()
        try:
            async with asyncio.timeout_at(None) as scope:
                if deadline is not None:
                    scope.reschedule(asyncio.get_running_loop().time()
                                     + deadline - time.monotonic())
                async with self.session.post(url, json=upstream) as resp:
                    if resp.status != 200:
                        data = await resp.read()
                        if resp.status >= 500:
                            return _status_reason(resp.status)
                        return Refused(resp.status, data, resp.content_type)
                    if stream is not None:
                        await stream.open()
                    async for events in _events(resp.content):
                        for data in events:
                            out = answer.take_plain(data)
                            tokens = out is not None
                            if out is None:
                                if data == b"[DONE]":
                                    ended = True
                                    break
                                chunk = json.loads(data)
                                delta = read_chunk(upstream_kind, chunk)
                                if delta.error is not None:
                                    broken = ended = True
                                    break
                                out = answer.take(upstream_kind, data, chunk, delta)
                                tokens = bool(delta.token_ids)
                            if out is not None and stream is not None:
                                stream.hold(out)
                            if tokens and not got_token:
                                got_token = True
                                scope.reschedule(None)
                                breaks.token_sent()
                            if answer.finish_reason is not None and not finished:
                                # What follows (the usage chunk, [DONE]) comes at once: the
                                # body is read to its end, for a moment at most, so that its
                                # connection is kept for the next answer, not closed.
                                finished = True
                                scope.reschedule(asyncio.get_running_loop().time()
                                                 + TAIL_SECONDS)
                        # What precedes the first token (a chat's role chunk) waits for it;
                        # what one read brought goes to the client in one write.
                        if got_token and stream is not None:
                            await stream.flush()
                        if ended:
                            break
                    if finished:
                        await resp.content.read()
        except aiohttp.ClientConnectorError:
            return metrics.UPSTREAM_UNREACHABLE
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            broken = True   # a cut connection, a read past the deadline, a chunk cut mid-JSON
        if finished:
            return None
        if not got_token:
            return metrics.FAILED_BEFORE_FIRST_TOKEN
        return metrics.STREAM_BROKEN if broken else metrics.NO_FINISH_REASON

    async def _finish(self, answer: Answer, stream: Optional[ClientStream]
                      ) -> web.StreamResponse:
        if stream is None:
            return web.json_response(answer.response())
        return await stream.end((sse(answer.usage_chunk()) if answer.wants_usage else b"")
                                + DONE)

    async def _give_up(self, stream: Optional[ClientStream], reason: str, message: str
                       ) -> web.StreamResponse:
        metrics.GIVEN_UP.labels(reason).inc()
        body = error_body(message)
        if stream is None:
            return web.json_response(body, status=503)
        return await stream.end(sse(body) + DONE)

    # ------------------------------------------------------------ retried from scratch

    async def retried(self, request: web.Request, kind: str,
                      body: dict[str, Any]) -> web.StreamResponse:
        """A request that cannot be continued exactly: sent as it is, again while the client
        has received nothing; a stream cut after that ends with an error event."""
        stream = ClientStream(request) if body.get("stream") else None
        breaks = Breaks(self.limits)
        first = True
        while True:
            target = await self._target(first, breaks)
            first = False
            if target is None:
                return await self._no_target(stream, breaks)
            result = await self._forward(target.url + PATHS[kind], body, stream)
            if not isinstance(result, str):
                return result
            reason = result
            if stream is not None and stream.started:
                return await self._give_up(stream, metrics.NOT_CONTINUABLE, (
                    f"the answer broke ({reason.replace('_', ' ')}) and cannot be continued "
                    f"exactly: {why_not_continuable(body)}"))
            give_up = await breaks.next_attempt(reason)
            if give_up:
                return await self._give_up(stream, give_up,
                                           _give_up_message(give_up, reason, breaks))

    async def _forward(self, url: str, body: dict[str, Any], stream: Optional[ClientStream]
                       ) -> Union[str, web.StreamResponse]:
        """One attempt passed through; a break's reason when it failed."""
        done = False
        try:
            async with self.session.post(url, json=body) as resp:
                if resp.status >= 500:
                    await resp.read()
                    return _status_reason(resp.status)
                if stream is None or resp.status != 200:
                    data = await resp.read()
                    if stream is not None and stream.response is not None:
                        # An earlier attempt's 200 went out: the refusal can only be told
                        # in the stream.
                        return await self._give_up(stream, metrics.REFUSED, (
                            f"the answer could not be completed: refused with HTTP "
                            f"{resp.status} ({data[:200].decode(errors='replace')})"))
                    return web.Response(body=data, status=resp.status,
                                        content_type=resp.content_type)
                await stream.open()
                held: list[bytes] = []   # what precedes the first token (a chat's role)
                async for line in resp.content:
                    if not stream.started:
                        opening = _opening(line)
                        if opening is None:
                            return metrics.FAILED_BEFORE_FIRST_TOKEN
                        held.append(line)
                        if opening:
                            continue
                        line, held = b"".join(held), []
                    await stream.send(line)
                    done = done or line.endswith(b"data: [DONE]\n")
        except aiohttp.ClientConnectorError:
            return metrics.UPSTREAM_UNREACHABLE
        except aiohttp.ClientError:
            pass
        if not done:
            started = stream is not None and stream.started
            return metrics.STREAM_BROKEN if started else metrics.FAILED_BEFORE_FIRST_TOKEN
        return await stream.end()
