"""What the data path does when a long request meets a fault, derived from the plan.

vLLM's and llm-d's defaults were chosen for short prompts. At maxContextTokens a prefill
takes a minute and a recompute on a decode rank several, so the settings below come from
the performance model's figures at that length (performance.py), not from constants:

- `kv_load_failure_policy` (decode's --kv-transfer-config): when NIXL cannot read a
  request's KV (its prefill pod died mid-transfer, a NIC failed), vLLM 0.33 either fails
  the request at once (`fail`) or reschedules it to recompute the missing blocks on the
  decode rank (`recompute`; vllm/v1/core/sched/scheduler.py). A recompute runs the whole
  prompt's prefill on one decode rank, whose layout is made for decode, and every other
  request of that rank waits behind its chunks. `recompute` is chosen only when that costs
  no more than a retry through the prefill role (its prefill plus the KV transfer);
  otherwise the request fails fast and the client's retry is routed to a healthy prefill.
- `kv_lease_duration` (the NIXL connector's extra config, both roles; vLLM 0.33 replaced
  VLLM_NIXL_ABORT_REQUEST_TIMEOUT with it): how long a prefill keeps a finished request's
  KV blocks for decode to read. The decode engine renews the lease with a heartbeat every
  lease/6 seconds from its step loop (nixl/base_scheduler.py, base_worker.py), so the
  lease must span several of the longest engine steps at maxContextTokens; vLLM's 30 s
  default is the floor.
- The request timeout of the HTTPRoute (the gateway in front of the endpoint picker): the
  only deadline on the routed path, since the v0.10 routing sidecar has no request
  timeout of its own. It must outlast a queued max-context prefill, its transfer and the
  streamed answer.

Pure; the operator imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from longctx_core.sizing import cost_terms, performance, phase_timing, planner
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.hardware import H200

VLLM_DEFAULT_LEASE_SECONDS = 30
HEARTBEATS_PER_LEASE = 6          # vLLM sends a heartbeat every lease // 6 seconds
# A request may wait behind one max-context prefill already running on its prefill rank,
# and the model is a roofline (docs/performance.md): twice its time-to-first-token.
REQUEST_TTFT_FACTOR = 2
# The answer streamed after a max-context prompt, sized at the model's per-user rate.
STREAMED_ANSWER_TOKENS = 32768
# An explicit architecture has no performance model: the bounds used instead.
UNPRICED_REQUEST_TIMEOUT_SECONDS = 1800


@dataclass(frozen=True)
class FaultSettings:
    kv_load_failure_policy: str       # "fail" or "recompute"
    kv_lease_seconds: int
    request_timeout_seconds: int
    # The figures the choices rest on (None without a performance model).
    retry_seconds: Optional[float] = None       # prefill + KV transfer at maxContextTokens
    recompute_seconds: Optional[float] = None   # the same prompt prefilled on a decode rank
    longest_step_seconds: Optional[float] = None

    def why(self) -> str:
        if self.retry_seconds is None:
            return ("no performance model for an explicit architecture: fail on a lost KV "
                    "load, vLLM's lease, a "
                    f"{self.request_timeout_seconds} s request timeout")
        return (f"a lost KV load is {'recomputed' if self.kv_load_failure_policy == 'recompute' else 'failed'}"
                f" (recompute on a decode rank {self.recompute_seconds:.0f} s, retry through "
                f"prefill {self.retry_seconds:.0f} s); KV lease {self.kv_lease_seconds} s "
                f"(longest engine step {self.longest_step_seconds:.2f} s); request timeout "
                f"{self.request_timeout_seconds} s")


def fault_settings(spec: LongContextDeploymentSpec) -> FaultSettings:
    """The data path's fault settings at spec.maxContextTokens (see the module docstring)."""
    shape = cost_terms.model_shape(spec)
    if shape is None:
        return FaultSettings("fail", VLLM_DEFAULT_LEASE_SECONDS, UNPRICED_REQUEST_TIMEOUT_SECONDS)
    tokens = spec.maxContextTokens
    prefill_layout, decode_layout = planner.role_layouts(spec)
    prefill = phase_timing.prefill(shape, prefill_layout, H200, tokens).seconds
    transfer = phase_timing.kv_transfer_seconds(spec, H200, tokens)
    recompute = phase_timing.prefill(shape, decode_layout, H200, tokens).seconds
    retry = prefill + transfer
    chunk = min(cost_terms.PREFILL_CHUNK_TOKENS, tokens)
    longest_step = max(
        phase_timing.prefill_chunk(shape, prefill_layout, H200, chunk, tokens - chunk).seconds,
        phase_timing.decode_step(spec, shape, decode_layout, H200, tokens, 1).seconds)
    lease = max(VLLM_DEFAULT_LEASE_SECONDS, math.ceil(HEARTBEATS_PER_LEASE * longest_step))
    summary = performance.summary_at_max_context(spec)
    per_user = summary["decode"]["tokensPerSecondPerUser"] if summary else 0
    answer = STREAMED_ANSWER_TOKENS / per_user if per_user else UNPRICED_REQUEST_TIMEOUT_SECONDS
    timeout = math.ceil(REQUEST_TTFT_FACTOR * (retry + longest_step) + answer)
    return FaultSettings("recompute" if recompute <= retry else "fail", lease, timeout,
                         retry_seconds=retry, recompute_seconds=recompute,
                         longest_step_seconds=longest_step)
