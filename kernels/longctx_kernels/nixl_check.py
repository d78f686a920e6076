"""A NIXL transfer between two agents in one process over UCX, with its bandwidth.

This is what a serving pod's KV connector does between prefill and decode
workers, reduced to one READ of one registered buffer. A broken NIXL install,
a UCX that cannot move the memory type, or a wrong UCX transport setting fails
here instead of in the first request.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass

import torch

INSTALL_HINT = "install it with: pip install nixl==1.5.1 (it bundles UCX through nixl-cu12/nixl-cu13)"


@dataclass
class NixlTransferResult:
    memory: str  # "DRAM" (host) or "VRAM" (GPU)
    num_bytes: int
    bit_exact: bool
    gbytes_per_s: float  # median over the timed transfers


def _import_nixl():
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as exc:
        raise ImportError(f"the NIXL Python package is not importable ({exc}); {INSTALL_HINT}") from exc
    return nixl_agent, nixl_agent_config


def _wait(agent, handle, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        state = agent.check_xfer_state(handle)
        if state == "DONE":
            return
        if state == "ERR":
            raise RuntimeError("NIXL transfer reported ERR")
        if time.monotonic() > deadline:
            raise TimeoutError(f"NIXL transfer not done after {timeout_s} s")


def nixl_two_agent_transfer(
    num_bytes: int = 256 << 20, device: str = "cpu", repeats: int = 3, timeout_s: float = 60.0
) -> NixlTransferResult:
    """READ `num_bytes` from agent "target" into agent "initiator" over UCX.

    `device` is "cpu" (host memory) or "cuda" (GPU memory). Returns bit-exactness
    of the last transfer and the median bandwidth of `repeats` transfers after
    one warm-up.
    """
    nixl_agent, nixl_agent_config = _import_nixl()
    config = nixl_agent_config(backends=["UCX"])
    suffix = uuid.uuid4().hex[:8]  # agent names must be unique within a process
    initiator = nixl_agent(f"initiator-{suffix}", config)
    target = nixl_agent(f"target-{suffix}", config)

    gen = torch.Generator().manual_seed(1234)
    source = torch.randint(0, 256, (num_bytes,), dtype=torch.uint8, generator=gen).to(device)
    # Poison the destination with the bitwise complement: no byte matches before the copy.
    dest = (~source).clone()
    if device != "cpu":
        torch.cuda.synchronize()
    initiator.register_memory(dest)
    target.register_memory(source)
    remote_name = initiator.add_remote_agent(target.get_agent_metadata())
    handle = initiator.initialize_xfer(
        "READ", initiator.get_xfer_descs(dest), target.get_xfer_descs(source), remote_name
    )
    timings = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        if initiator.transfer(handle) == "ERR":
            raise RuntimeError("NIXL transfer could not be posted")
        _wait(initiator, handle, timeout_s)
        if i > 0:  # the first transfer warms up connections and registrations
            timings.append(time.perf_counter() - start)
    bit_exact = bool(torch.equal(dest, source))
    initiator.release_xfer_handle(handle)
    initiator.remove_remote_agent(remote_name)
    return NixlTransferResult(
        memory="DRAM" if device == "cpu" else "VRAM",
        num_bytes=num_bytes,
        bit_exact=bit_exact,
        gbytes_per_s=num_bytes / statistics.median(timings) / 1e9,
    )
