"""longctx's vLLM general plugin: vLLM loads it in every process of an engine (API server,
engine core, workers) before the KV connector starts, through the entry point group
`vllm.general_plugins` (pyproject.toml).

It gives NIXL's progress thread the delay the operator rendered in
LONGCTX_NIXL_PROGRESS_DELAY_US. NIXL's Python API (nixl 1.5) creates every agent with a
delay of 0, and its UCX progress thread then polls without ever sleeping: each engine keeps
one core busy while idle. On the CPU platform the engines share a few cores with each other,
so the operator renders a delay (sizing/cpu_platform.py), and the thread waits on UCX's
event file for at most that long instead. Unset, nothing is patched.

Nothing is imported from NIXL until vLLM calls register(), and only when the delay is set.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from longctx_core import contract


def with_progress_delay(make_agent: Callable[..., Any], delay_us: int) -> Callable[..., Any]:
    """NIXL's agent constructor, with `delay_us` set on the config it is given."""
    def make(name: str, config: Any) -> Any:
        config.pthrDelay = delay_us
        return make_agent(name, config)
    make.__wrapped__ = make_agent  # type: ignore[attr-defined]
    return make


def register() -> None:
    value = os.environ.get(contract.ENV_NIXL_PROGRESS_DELAY_US)
    if not value:
        return
    from nixl._api import nixl_agent

    # The bindings module nixl_agent builds its config and agent with.
    bindings = nixl_agent.__init__.__globals__["nixlBind"]
    if not hasattr(bindings.nixlAgent, "__wrapped__"):
        bindings.nixlAgent = with_progress_delay(bindings.nixlAgent, int(value))
