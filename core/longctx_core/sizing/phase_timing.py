"""Time of each serving phase on a hardware profile: a prefill chunk and a whole prompt (with
and without decode context parallelism), the KV transfer, and one decode step."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from longctx_core.sizing import kv_sizing, models
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.cost_terms import (ACCEPTED_PER_DRAFT, BF16, DCP_GATHER_KERNELS_PER_INDEX_LAYER,
                         DCP_GATHER_KERNELS_PER_LAYER, FP32, HISPARSE_MISS_FRACTION,
                         KERNELS_PER_LAYER, MIN_HEADS_FOR_BF16_PREFILL, PREFILL_CHUNK_TOKENS,
                         Costs, Shape, add_experts, add_launches, add_tp_all_reduce,
                         dcp_query_exchange, gemm_efficiency, padded_heads)
from longctx_core.sizing.hardware import HardwareProfile

# ------------------------------------------------------------ prefill


def _attended_keys(shape: Shape, context: int, tokens: int) -> int:
    """Sum over a chunk's queries of the keys sparse MLA attends: min(topK, causal prefix)."""
    k = shape.top_k
    first, last = context + 1, context + tokens
    if first >= k:
        return tokens * k
    below = min(last, k - 1)
    return (first + below) * (below - first + 1) // 2 + max(last - below, 0) * k


def prefill_chunk(shape: Shape, layout: Any, hw: HardwareProfile, tokens: int,
                  context: int, costs: Optional[Costs] = None) -> Costs:
    """One prefill step of `tokens` new tokens after `context` earlier ones, on the GPU of
    the engine rank that serves the request (PCP splits the queries, TP the heads)."""
    costs = costs if costs is not None else Costs()
    tp, pcp, dcp = layout.tensorParallel, layout.prefillContextParallel, \
        layout.decodeContextParallel
    queries = tokens / pcp
    heads = shape.heads / tp
    sequence = context + tokens
    # Projections (attention, indexer, shared expert, dense MLPs): replicated under PCP.
    costs.kernel("projections", hw, 2 * shape.replicated_bytes / tp * queries,
                 hw.fp8FlopsPerS, gemm_efficiency(hw, queries), shape.replicated_bytes / tp,
                 hw.eff("hbm"))
    # Indexer: every query scores every earlier key (the quadratic term) into fp32 logits.
    # TP replicates it.
    scored = (tokens * context + tokens * (tokens + 1) / 2) / pcp
    costs.kernel("indexer", hw, shape.index_flops_per_key * scored * shape.index_layers,
                 hw.fp8FlopsPerS, hw.eff("indexerPrefill"),
                 FP32 * scored * shape.index_layers, hw.eff("hbm"))
    # Top-k of each query's logits: a scan of the row, then a selection whose time is fixed.
    costs.kernel("indexerTopK", hw, 0.0, hw.bf16FlopsPerS, 1.0,
                 FP32 * (scored + queries * shape.top_k) * shape.index_layers,
                 hw.eff("topkScan"))
    costs.add("indexerTopK", hw.topkSelectS * shape.index_layers, "compute")
    # Sparse MLA at top-k over absorbed projections: linear in the chunk, flat in context.
    keys = _attended_keys(shape, context, tokens) / pcp
    gathers_kv = pcp > 1 and dcp > 1
    if heads < MIN_HEADS_FOR_BF16_PREFILL and not gathers_kv:
        # The fp8 decode kernel over the paged cache; under DCP (no PCP) each GPU attends
        # its shard of the top-k for the group's gathered heads, as in decode.
        group_heads = min(shape.heads, heads * dcp)
        costs.kernel("sparseMla", hw, shape.mla_flops_per_key * padded_heads(group_heads)
                     * keys / dcp * shape.layers, hw.bf16FlopsPerS, hw.eff("sparseMlaDecode"),
                     keys / dcp * (shape.row + kv_sizing.INDEX_BYTES) * shape.layers,
                     hw.eff("hbm"))
        if dcp > 1:
            dcp_query_exchange(costs, shape, hw, queries, group_heads, dcp,
                                shape.layers, shape.index_layers)
    else:
        costs.kernel("sparseMla", hw, shape.mla_flops_per_key * padded_heads(heads) * keys
                     * shape.layers, hw.bf16FlopsPerS, hw.eff("sparseMlaPrefill"), 0.0,
                     hw.eff("hbm"))
        # The bf16 kernel reads a workspace: every layer, each GPU upconverts the fp8 rows
        # of the whole sequence it holds (all of them; its 1/DCP shard under PCP x DCP),
        # and copies the indexer keys it holds out of the paged cache.
        held = sequence / dcp if gathers_kv else sequence
        costs.kernel("kvUpconvert", hw, 0.0, hw.bf16FlopsPerS, 1.0,
                     held * ((shape.row + shape.row_bf16) * shape.layers
                            + 2 * shape.index_row * shape.index_layers), hw.eff("hbm"))
    if gathers_kv:
        # vLLM's PCP x DCP prefill: every layer all-gathers the bf16 shards into a copy of
        # the whole sequence (one collective), and every indexer layer the fp8 keys and their
        # scales (two), then puts the keys back in token order.
        costs.link("dcpAllGather", hw, (dcp - 1) / dcp * sequence
                   * (shape.row_bf16 * shape.layers + shape.index_row * shape.index_layers),
                   shape.layers + 2 * shape.index_layers)
        costs.kernel("dcpDeinterleave", hw, 0.0, hw.bf16FlopsPerS, 1.0,
                     2 * sequence * shape.index_row * shape.index_layers, hw.eff("hbm"))
    # The request's tokens go through the whole expert-parallel group.
    add_experts(costs, shape, layout, hw, group_tokens=tokens)
    add_tp_all_reduce(costs, shape, layout, hw, tokens)
    if pcp > 1:   # the chunk's new KV, all-gathered before the cache write
        costs.link("pcpAllGather", hw, (pcp - 1) / pcp * tokens
                   * (shape.row_bf16 * shape.layers + shape.index_row * shape.index_layers),
                   shape.layers + shape.index_layers)
    # At the eager cost: attention and the indexer run outside vLLM's piecewise CUDA graphs
    # (the graphed rest of a step of at most 512 tokens a GPU costs ~0.8 us less a kernel).
    kernels = KERNELS_PER_LAYER * shape.layers
    if gathers_kv:
        kernels += DCP_GATHER_KERNELS_PER_LAYER * shape.layers \
            + DCP_GATHER_KERNELS_PER_INDEX_LAYER * shape.index_layers
    add_launches(costs, kernels, hw.eagerKernelS)
    return costs


def prefill(shape: Shape, layout: Any, hw: HardwareProfile, prompt_tokens: int,
            cached_tokens: int = 0, chunk_tokens: int = PREFILL_CHUNK_TOKENS) -> Costs:
    """The prompt's uncached tokens in chunks of `chunk_tokens`, after a cached prefix held on
    the GPU (a prefix loaded back from the CPU offload is not priced)."""
    costs = Costs()
    context = cached_tokens
    while context < prompt_tokens:
        tokens = min(chunk_tokens, prompt_tokens - context)
        prefill_chunk(shape, layout, hw, tokens, context, costs)
        context += tokens
    return costs


DCP_TERMS = ("dcpAllGather", "dcpDeinterleave", "dcpCombine")


def without_dcp(layout: Any) -> Any:
    return dataclasses.replace(layout, decodeContextParallel=1)


def dcp_overhead(with_dcp: Costs, without: Costs) -> float:
    """What DCP adds to the same steps of the same layout without it (the seed's "+6% per
    step"): its gathers, less the upconvert of the shards other GPUs now hold."""
    return with_dcp.seconds / without.seconds - 1 if without.seconds else 0.0


# ------------------------------------------------------------ KV transfer and decode


def kv_transfer_seconds(spec: LongContextDeploymentSpec, hw: HardwareProfile,
                        tokens: int) -> float:
    """NIXL moves the request's KV (every layer, MTP included) from the prefill GPUs to one
    decode rank; that rank's NIC carries all of it."""
    arch = models.resolve_architecture(spec.model)
    bpt = kv_sizing.kv_bytes_per_token(arch, spec.engine.kvCacheDtype)
    return bpt.total * tokens / hw.rdmaBytesPerS + hw.collectiveLatencyS


def acceptance_length(spec: LongContextDeploymentSpec, given: Optional[float] = None) -> float:
    if given is not None:
        return given
    if spec.engine.speculative.method != "mtp":
        return 1.0
    return 1.0 + ACCEPTED_PER_DRAFT * spec.engine.speculative.draftTokens


@dataclass(frozen=True)
class DecodeStep:
    costs: Costs
    host_gather_seconds: float   # HiSparse's PCIe gathers, overlapped with the layers
    batch_per_rank: int

    @property
    def seconds(self) -> float:
        return max(self.costs.seconds, self.host_gather_seconds)

    @property
    def bound(self) -> str:
        return "PCIe" if self.host_gather_seconds > self.costs.seconds else self.costs.bound


def _decode_pass(costs: Costs, shape: Shape, layout: Any, hw: HardwareProfile, batch: int,
                 rows: int, context: int, layers: Shape) -> None:
    """One forward pass of `layers` (a Shape whose layer counts are the pass's) for `batch`
    requests of `rows` query tokens each at `context` tokens."""
    tp, dcp = layout.tensorParallel, layout.decodeContextParallel
    tokens = batch * rows
    share = layers.layers / shape.layers
    costs.kernel("projections", hw, 2 * shape.replicated_bytes * share / tp * tokens,
                 hw.fp8FlopsPerS, gemm_efficiency(hw, tokens), shape.replicated_bytes * share / tp,
                 hw.eff("hbm"))
    heads = min(shape.heads, shape.heads // tp * dcp)   # after the DCP query gather
    keys = shape.top_k / dcp
    costs.kernel("sparseMla", hw, shape.mla_flops_per_key * padded_heads(heads) * keys
                 * tokens * layers.layers,
                 hw.bf16FlopsPerS, hw.eff("sparseMlaDecode"),
                 tokens * (keys * (shape.row + kv_sizing.INDEX_BYTES)
                           + heads * shape.qo_bytes_per_head) * layers.layers, hw.eff("hbm"))
    local = context / dcp   # each request's keys are read once for all its query rows
    costs.kernel("indexer", hw, shape.index_flops_per_key * local * tokens * layers.index_layers,
                 hw.fp8FlopsPerS, hw.eff("gemm"),
                 (batch * local * shape.index_row + 2 * 4 * local * tokens)
                 * layers.index_layers, hw.eff("indexerDecode"))
    per_gpu = tokens / tp
    add_experts(costs, layers, layout, hw, group_tokens=per_gpu * layout.expert_split)
    add_tp_all_reduce(costs, layers, layout, hw, tokens)
    if dcp > 1:
        dcp_query_exchange(costs, shape, hw, tokens, heads, dcp, layers.layers,
                            layers.index_layers)
    costs.kernel("lmHead", hw, 2 * shape.lm_head_bytes / BF16 / tp * tokens, hw.bf16FlopsPerS,
                 gemm_efficiency(hw, tokens), shape.lm_head_bytes / tp, hw.eff("hbm"))
    add_launches(costs, KERNELS_PER_LAYER * layers.layers, hw.kernelLaunchS)   # a CUDA graph


def decode_step(spec: LongContextDeploymentSpec, shape: Shape, layout: Any,
                hw: HardwareProfile, context: int, concurrency: int,
                miss_fraction: float = HISPARSE_MISS_FRACTION) -> DecodeStep:
    """One decode step of a rank holding its share of `concurrency` requests at `context`
    tokens: MTP's draft passes (the MTP layer once per draft token), then the verify pass of
    1 + draft tokens rows per request through every layer."""
    batch = max(1, math.ceil(concurrency / max(layout.ranks, 1)))
    draft = spec.engine.speculative.draftTokens if spec.engine.speculative.method == "mtp" else 0
    costs = Costs()
    _decode_pass(costs, shape, layout, hw, batch, 1 + draft, context, shape)
    arch = models.resolve_architecture(spec.model)
    if draft and arch.mtpLayers:
        mtp = dataclasses.replace(shape, layers=arch.mtpLayers, index_layers=arch.mtpLayers,
                                  moe_layers=arch.mtpLayers)
        for _ in range(draft):
            _decode_pass(costs, shape, layout, hw, batch, 1, context, mtp)
    host = 0.0
    if spec.decode.hiSparse.enabled:
        missing = batch * (1 + draft) * shape.top_k * miss_fraction
        host = missing * shape.row * shape.layers / (hw.pcieBytesPerS * hw.eff("hostGather"))
    return DecodeStep(costs, host, batch)
