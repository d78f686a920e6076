"""A roofline-style performance model: how fast a layout serves (prefill, KV transfer, decode).

Pure Python, no torch: the operator imports it for status.plan. Every term is a kernel or a
transfer of one layer, priced on a hardware profile (hardware.py):

    kernel time     = max(FLOPs / (rate x efficiency), bytes / (HBM x efficiency))
    transfer time   = bytes / link bandwidth + collective latency
    phase time      = the sum of its terms (vLLM 0.33 overlaps none of them, except HiSparse's
                      host-row gathers, which run on a copy stream beside the layers)

and the bound of a phase is the category (compute, HBM, interconnect, PCIe, launch) holding
most of its time. docs/performance.md has the equations and the validation against the
seed article's figures. Capacity (what fits) is the planner's; this module only prices time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from longctx_core.sizing import planner
from longctx_core.sizing.decode_loss import decode_loss, generated_tokens
from longctx_core.sizing.cost_terms import PREFILL_CHUNK_TOKENS, model_shape
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.hardware import H200, HardwareProfile
from longctx_core.sizing.memory import hisparse_pool_per_rank
from longctx_core.sizing.phase_timing import (DCP_TERMS, acceptance_length, dcp_overhead, decode_step,
                           kv_transfer_seconds, prefill, without_dcp)
from longctx_core.quantity import parse_bytes
from longctx_core.api.schema import Quantity

# ------------------------------------------------------------ one prediction


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int
    cached_tokens: int = 0
    output_tokens: int = 0
    concurrency: int = 1
    acceptance_length: Optional[float] = None

    def check(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"--prompt-tokens must be at least 1, got {self.prompt_tokens}")
        if not 0 <= self.cached_tokens < self.prompt_tokens:
            raise ValueError(f"--cached-tokens must be in [0, --prompt-tokens), got "
                             f"{self.cached_tokens} with --prompt-tokens {self.prompt_tokens}")
        if self.output_tokens < 0:
            raise ValueError(f"--output-tokens must not be negative, got {self.output_tokens}")
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.acceptance_length is not None and self.acceptance_length < 1:
            raise ValueError(f"--acceptance-length must be at least 1, got "
                             f"{self.acceptance_length}")


def _rounded(parts: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v > 0}


def _held_at(spec: LongContextDeploymentSpec, tokens: int) -> int:
    """Requests of `tokens` the decode role holds at once: the planner, at that length."""
    return planner.plan(dataclasses.replace(spec, maxContextTokens=tokens)).decode.max_concurrent


def predict(spec: LongContextDeploymentSpec, workload: Workload,
            hardware: Optional[HardwareProfile] = None) -> Optional[dict[str, Any]]:
    """The `performance` object of `longctx plan -o json`; None when the model lacks the
    architecture's widths (an explicit architecture)."""
    workload.check()
    shape = model_shape(spec)
    if shape is None:
        return None
    hw = hardware or H200
    prefill_layout, decode_layout = planner.role_layouts(spec)
    pre = prefill(shape, prefill_layout, hw, workload.prompt_tokens, workload.cached_tokens)
    pre_without_dcp = prefill(shape, without_dcp(prefill_layout), hw, workload.prompt_tokens,
                              workload.cached_tokens)
    transfer = kv_transfer_seconds(spec, hw, workload.prompt_tokens)
    step = decode_step(spec, shape, decode_layout, hw, workload.prompt_tokens,
                       workload.concurrency)
    accepted = acceptance_length(spec, workload.acceptance_length)
    held = _held_at(spec, workload.prompt_tokens + workload.output_tokens)
    # Requests beyond what the decode role holds wait their turn: per user, the rate is
    # shared among the waiting ones.
    served = min(workload.concurrency, max(held, 0))
    per_request = accepted / step.seconds
    per_user = per_request * served / workload.concurrency
    decode_gpus = decode_layout.replicas * decode_layout.gpusPerPod
    ttft = pre.seconds + transfer + step.seconds
    out: dict[str, Any] = {
        "hardware": hw.name,
        "promptTokens": workload.prompt_tokens,
        "cachedTokens": workload.cached_tokens,
        "outputTokens": workload.output_tokens,
        "concurrency": workload.concurrency,
        "acceptanceLength": round(accepted, 3),
        "prefill": {
            "layout": prefill_layout.describe(),
            "seconds": round(pre.seconds, 4),
            "bound": pre.bound,
            "chunkTokens": PREFILL_CHUNK_TOKENS,
            "dcpAllGatherSeconds": round(sum(pre.terms.get(t, 0.0) for t in DCP_TERMS), 4),
            "dcpOverheadPercent": round(100 * dcp_overhead(pre, pre_without_dcp), 1),
            "partsSeconds": _rounded(pre.terms),
        },
        "kvTransfer": {"seconds": round(transfer, 4), "bound": "interconnect"},
        "ttftSeconds": round(ttft, 4),
        "decode": {
            "layout": decode_layout.describe(),
            "contextTokens": workload.prompt_tokens,
            "batchPerRank": step.batch_per_rank,
            "requestsHeld": held,
            "stepSeconds": round(step.seconds, 6),
            "bound": step.bound,
            "hostGatherSeconds": round(step.host_gather_seconds, 6),
            "tokensPerSecondPerUser": round(per_user, 2),
            # A role scaled to zero serves nothing.
            "tokensPerSecondPerGpu": round(per_request * served / decode_gpus, 2)
            if decode_gpus else 0.0,
            "partsSeconds": _rounded(step.costs.terms),
        },
    }
    # The loss at the end of the workload's answer (at max context: its last token).
    context = workload.prompt_tokens + workload.output_tokens
    out["decodeLoss"] = decode_loss(spec, shape, hw, context,
                                    generated_tokens(context, workload.output_tokens),
                                    workload.concurrency)
    if workload.output_tokens:
        out["requestSeconds"] = round(ttft + workload.output_tokens / per_user, 3) \
            if per_user else None
    return out


def summary_at_max_context(spec: LongContextDeploymentSpec,
                           hardware: Optional[HardwareProfile] = None,
                           held: Optional[int] = None) -> Optional[dict[str, Any]]:
    """The prediction at maxContextTokens for status.plan: a whole max-context prompt from
    scratch, its KV transfer, and decode at that context with as many requests as the decode
    role holds (at least one; `held`: from the spec's capacity plan when the caller has it).
    None when the model cannot price the architecture."""
    tokens = spec.maxContextTokens
    if held is None:
        held = _held_at(spec, tokens)
    return predict(spec, Workload(prompt_tokens=tokens, concurrency=max(held, 1)), hardware)


# ------------------------------------------------------------ the seed's alternatives


def alternatives(spec: LongContextDeploymentSpec) -> list[tuple[str, LongContextDeploymentSpec]]:
    """The seed's baselines on the same model and GPUs: DP8 prefill with the same CPU offload
    split over its ranks, TP8 prefill, PCP without DCP, and offload-only decode with the
    HiSparse pool's host memory given to the offload."""
    p, d = spec.prefill, spec.decode
    gpus = p.gpusPerPod
    prefill_offload = parse_bytes(p.cpuOffloadPerRank) * planner.role_layouts(spec)[0].ranks
    no_cp = dataclasses.replace(p.contextParallel, prefill=1, decode=1)

    def with_prefill(**changes: Any) -> LongContextDeploymentSpec:
        return dataclasses.replace(spec, prefill=dataclasses.replace(p, **changes))

    host = hisparse_pool_per_rank(spec) if d.hiSparse.enabled else 0
    offload_only = dataclasses.replace(
        spec, decode=dataclasses.replace(
            d, hiSparse=dataclasses.replace(d.hiSparse, enabled=False),
            cpuOffloadPerRank=Quantity(str(parse_bytes(d.cpuOffloadPerRank) + host))))
    pcp = max(p.contextParallel.prefill, 2)
    return [
        (f"DP{gpus} prefill + offload", with_prefill(
            contextParallel=no_cp, dataParallel=gpus, tensorParallel=1,
            cpuOffloadPerRank=Quantity(str(prefill_offload // gpus)))),
        (f"TP{gpus} prefill", with_prefill(contextParallel=no_cp, dataParallel=1,
                                           tensorParallel=gpus)),
        (f"PCP{pcp} prefill, no DCP", with_prefill(
            contextParallel=dataclasses.replace(p.contextParallel, prefill=pcp, decode=1),
            dataParallel=max(gpus // pcp, 1), tensorParallel=1)),
        ("offload-only decode", offload_only),
    ]


def _row(name: str, spec: LongContextDeploymentSpec, workload: Workload,
         hw: HardwareProfile) -> dict[str, Any]:
    fit = planner.plan(spec)
    held = planner.plan(dataclasses.replace(
        spec, maxContextTokens=workload.prompt_tokens + workload.output_tokens))
    perf = predict(spec, workload, hw)
    refused = [role for role, r in (("prefill", fit.prefill), ("decode", fit.decode)) if not r.fits]
    return {
        "name": name,
        "prefillLayout": fit.prefill.layout.describe(),
        "decodeLayout": fit.decode.layout.describe(),
        "fitsMaxContext": fit.fits,
        "refusedRoles": refused,
        "holdsPrompt": held.prefill.fits and held.decode.fits,
        "ttftSeconds": perf["ttftSeconds"] if perf and held.prefill.fits else None,
        "tokensPerSecondPerUser": perf["decode"]["tokensPerSecondPerUser"]
        if perf and held.decode.fits else None,
    }


def compare(spec: LongContextDeploymentSpec, workload: Workload,
            hardware: Optional[HardwareProfile] = None) -> list[dict[str, Any]]:
    """The spec's layout and the seed's alternatives: fit (the planner's), TTFT and decode
    tokens/s per user, with ratios against the spec's layout."""
    hw = hardware or H200
    rows = [_row("this spec", spec, workload, hw)] + \
        [_row(name, alt, workload, hw) for name, alt in alternatives(spec)]
    base = rows[0]
    for row in rows:
        for key, ratio in (("ttftSeconds", "ttftRatio"), ("tokensPerSecondPerUser",
                                                           "tokensPerSecondPerUserRatio")):
            row[ratio] = round(row[key] / base[key], 2) if row[key] and base[key] else None
    return rows
