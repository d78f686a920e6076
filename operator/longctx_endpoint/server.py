"""The endpoint's HTTP server (aiohttp): the OpenAI API clients use, /health and /metrics on
one port (contract.ENDPOINT_PORT).

Chat and completions go through the Relay; any other path (/v1/models, ...) is passed to the
router as it is. On SIGTERM the endpoint drains: /health turns 503, the listener closes,
and the answers in flight finish, for at most the drain window; then it exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Optional

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from longctx_endpoint.openai import CHAT, COMPLETION, error_body
from longctx_endpoint.relay import Limits, Relay
from longctx_endpoint.upstreams import Upstreams

log = logging.getLogger(__name__)

DRAINING = web.AppKey("draining", asyncio.Event)
RELAY = web.AppKey("relay", Relay)
# Connecting to an upstream pod is local to the cluster network; a longer wait is a dead one.
CONNECT_SECONDS = 5.0


async def _health(request: web.Request) -> web.Response:
    if request.app[DRAINING].is_set():
        return web.Response(status=503, text="draining")
    return web.Response(text="ok")


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _chat(request: web.Request) -> web.StreamResponse:
    return await request.app[RELAY].handle(request, CHAT)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await request.app[RELAY].handle(request, COMPLETION)


async def _passed(request: web.Request) -> web.Response:
    """Any other path, sent to the router once."""
    relay = request.app[RELAY]
    target = relay.upstreams.target()
    if target is None:
        return web.json_response(error_body("no router or engine is ready"), status=503)
    try:
        async with relay.session.request(request.method, target.url + request.path_qs,
                                         data=await request.read(),
                                         headers={"Content-Type": request.content_type}
                                         ) as resp:
            return web.Response(body=await resp.read(), status=resp.status,
                                content_type=resp.content_type)
    except aiohttp.ClientError as exc:
        return web.json_response(error_body(f"the router did not answer: {exc}"), status=503)


def make_app(upstreams: Upstreams, limits: Limits,
             session: Optional[aiohttp.ClientSession] = None) -> web.Application:
    """The application; it opens its upstream session on start unless given one."""
    app = web.Application(client_max_size=64 * 2**20)
    app[DRAINING] = asyncio.Event()

    async def open_session(app: web.Application):
        own = session is None
        # One session for every answer: its connections to the upstreams are kept and
        # reused. No total limit: an answer at max context streams for many minutes. A read
        # that waits longer than the give-up window is a dead upstream. No cookie jar: one
        # client's cookies are no other's.
        client = session or aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SECONDS,
                                          sock_read=limits.give_up_seconds))
        app[RELAY] = Relay(client, upstreams, limits)
        yield
        if own:
            await client.close()

    app.cleanup_ctx.append(open_session)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_route("*", "/v1/{tail:.*}", _passed)
    return app


async def serve(app: web.Application, host: str, port: int, drain_seconds: float) -> None:
    """Serves until SIGTERM or SIGINT, then drains (module docstring): aiohttp's graceful
    shutdown closes the listener and the idle connections and waits for the requests in
    flight, for at most the drain window."""
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=drain_seconds)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("serving on %s:%d", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    app[DRAINING].set()
    started = time.monotonic()
    await runner.cleanup()
    log.info("drained in %.1f s", time.monotonic() - started)
