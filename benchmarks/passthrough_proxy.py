"""The physical baseline of benchmarks/endpoint_overhead.py: the least any relay written with
the endpoint's stack (aiohttp on uvloop) can add, one more HTTP hop each way. It passes a
chat request to the router as it came and the router's stream back as it arrives, and does
nothing else: no parsing, no token ids, no continuation.

    python benchmarks/passthrough_proxy.py PORT ROUTER_URL
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
ROUTER = web.AppKey("router", str)


async def _chat(request: web.Request) -> web.StreamResponse:
    async with request.app[SESSION].post(
            request.app[ROUTER] + "/v1/chat/completions", data=await request.read(),
            headers={"Content-Type": "application/json"}) as upstream:
        response = web.StreamResponse(status=upstream.status, headers={
            "Content-Type": upstream.headers.get("Content-Type", "text/event-stream")})
        await response.prepare(request)
        async for data in upstream.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def app(router: str) -> web.Application:
    application = web.Application()
    application[ROUTER] = router

    async def session(application: web.Application):
        application[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await application[SESSION].close()
    application.cleanup_ctx.append(session)
    application.router.add_post("/v1/chat/completions", _chat)
    application.router.add_get("/health", _health)
    return application


if __name__ == "__main__":
    web.run_app(app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), access_log=None,
                loop=uvloop.new_event_loop(), print=None)
