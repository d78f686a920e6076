"""What a client pays when the decode engine serving its answer dies, from the performance
model (phase_timing.py); `longctx plan` shows it as `performance.decodeLoss`.

The endpoint continues the answer by sending the request again, with the tokens generated
so far, through the router (docs/data-path.md). The client's stream pauses for:

- **another decode**: prefill reads the replayed prompt's prefix back from its CPU offload
  tier (each prefill GPU its own copy or DCP shard, over its PCIe link), computes the
  generated tokens after it (decode made them, so prefill never cached them), NIXL moves
  the whole context's KV to a decode rank, and that rank runs one step. When the prefix
  does not fit one prefill rank's offload, the prefill computes it all again: the full
  re-prefill the pause is compared with.
- **no decode Ready** (the seed's shape: one decode pod, restarting): prefill serves the
  answer on its own, after the same prefix load and tail, with no transfer; it then
  generates at its own decode speed at that context, on the prefill layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing import kv_sizing, models, planner
from longctx_core.sizing.cost_terms import Shape
from longctx_core.sizing.hardware import HardwareProfile
from longctx_core.sizing.phase_timing import (acceptance_length, decode_step,
                                              kv_transfer_seconds, prefill)

# The answer tokens generated before the loss when the workload names none: a few thousand
# tokens into an answer (`longctx plan --output-tokens` sets it).
GENERATED_BEFORE_LOSS = 4096


def generated_tokens(context_tokens: int, output_tokens: int) -> int:
    """The answer's tokens, within a context of `context_tokens`, that the replay computes."""
    return min(output_tokens or GENERATED_BEFORE_LOSS, context_tokens - 1)


def prefix_load_seconds(spec: LongContextDeploymentSpec, hw: HardwareProfile,
                        prefix_tokens: int) -> float:
    """A prefix's KV from prefill's CPU offload tier back to its GPUs: each GPU loads what
    it holds of one request (kv_sizing.kv_bytes_per_gpu) over its own PCIe link."""
    arch = models.resolve_architecture(spec.model)
    bpt = kv_sizing.kv_bytes_per_token(arch, spec.engine.kvCacheDtype)
    layout = planner.role_layouts(spec)[0]
    return kv_sizing.kv_bytes_per_gpu(bpt, prefix_tokens, layout) / hw.pcieBytesPerS


def decode_loss(spec: LongContextDeploymentSpec, shape: Shape, hw: HardwareProfile,
                context_tokens: int, generated: int, concurrency: int) -> dict[str, Any]:
    """The `performance.decodeLoss` object: a decode lost when the answer's context holds
    `context_tokens`, `generated` of them the answer's, at `concurrency` requests."""
    prefill_layout, decode_layout = planner.role_layouts(spec)
    prefix = context_tokens - generated
    at_context = planner.plan(dataclasses.replace(spec, maxContextTokens=context_tokens))
    in_offload = at_context.prefill.cpu_offload_tokens_per_rank >= prefix
    load = prefix_load_seconds(spec, hw, prefix)
    tail = prefill(shape, prefill_layout, hw, context_tokens, prefix).seconds
    full = prefill(shape, prefill_layout, hw, context_tokens).seconds
    replay = load + tail if in_offload else full
    transfer = kv_transfer_seconds(spec, hw, context_tokens)
    step = decode_step(spec, shape, decode_layout, hw, context_tokens, concurrency)
    # Prefill generating alone: its own layout, no HiSparse (a decode-only feature).
    alone_spec = dataclasses.replace(spec, decode=dataclasses.replace(
        spec.decode, hiSparse=dataclasses.replace(spec.decode.hiSparse, enabled=False)))
    alone = decode_step(alone_spec, shape, prefill_layout, hw, context_tokens, concurrency)
    accepted = acceptance_length(spec)
    held = max(at_context.prefill.max_concurrent, 0)
    alone_per_user = accepted / alone.seconds * min(concurrency, held) / concurrency
    pd_per_user = accepted / step.seconds * min(
        concurrency, max(at_context.decode.max_concurrent, 0)) / concurrency
    return {
        "contextTokens": context_tokens,
        "generatedTokens": generated,
        "prefixInCpuOffload": in_offload,
        "prefixLoadSeconds": round(load, 4),
        "replayPrefillSeconds": round(tail, 4),
        "kvTransferSeconds": round(transfer, 4),
        "pauseSeconds": round(replay + transfer + step.seconds, 4),
        "fullReprefillPauseSeconds": round(full + transfer + step.seconds, 4),
        "prefillOnly": {
            "layout": prefill_layout.describe(),
            "pauseSeconds": round(replay + alone.seconds, 4),
            "stepSeconds": round(alone.seconds, 6),
            "bound": alone.bound,
            "requestsHeld": held,
            "tokensPerSecondPerUser": round(alone_per_user, 2),
            "speedOfPd": round(alone_per_user / pd_per_user, 3) if pd_per_user else None,
        },
    }
