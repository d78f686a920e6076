"""`longctx-endpoint`: the client-facing endpoint of one LongContextDeployment (the operator
renders its flags, builders/endpoint.py)."""

from __future__ import annotations

import argparse
import logging
from typing import Optional

import uvloop

from longctx_core import contract

from longctx_endpoint.relay import Limits
from longctx_endpoint.server import make_app, serve
from longctx_endpoint.upstreams import PodWatch, Upstreams


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longctx-endpoint", description=__doc__)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=contract.ENDPOINT_PORT)
    p.add_argument("--namespace", help="the CR's namespace")
    p.add_argument("--instance", help="the CR's name (its pods' instance label); with "
                   "--namespace, the endpoint watches the CR's pods")
    p.add_argument("--router-url", help="a fixed router address (llm-d: the Gateway); "
                   "unset: vllm-router's Ready pods, found by label. Without a pod watch, "
                   "every attempt goes here")
    p.add_argument("--max-attempts", type=int, default=3,
                   help="continuation attempts per answer")
    p.add_argument("--give-up-seconds", type=float, default=600,
                   help="from a break to giving up, unless a continuation delivers a token")
    p.add_argument("--drain-seconds", type=float, default=600,
                   help="after SIGTERM, how long answers in flight may take to finish")
    p.add_argument("--log-level", default="info")
    return p


def main(argv: Optional[list[str]] = None) -> None:
    cli = parser()
    args = cli.parse_args(argv)
    watched = bool(args.namespace and args.instance)
    if not watched and not args.router_url:
        cli.error("give --namespace and --instance (the CR's pods are watched), or "
                  "--router-url (every attempt goes there)")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # A line per request is the engines' to log (vLLM logs each one it serves) and
        # costs the endpoint CPU beside the engines: only at --log-level debug.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    upstreams = Upstreams(router_url=args.router_url)
    if watched:
        PodWatch(upstreams, args.namespace, args.instance).start()
    app = make_app(upstreams, Limits(args.max_attempts, args.give_up_seconds))
    # The event loop is most of what relaying a token costs the endpoint's CPU, and uvloop's
    # (libuv, in C) costs far less than asyncio's own (docs/data-path.md#its-cost-on-the-hot-path).
    uvloop.run(serve(app, args.host, args.port, args.drain_seconds))


if __name__ == "__main__":
    main()
