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
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from . import models, planner
from .api import LongContextDeploymentSpec
from .hardware import H200, HardwareProfile
from .memory import hisparse_pool_per_rank
from .quantity import parse_bytes
from .schema import Quantity

PREFILL_CHUNK_TOKENS = 8192     # vLLM 0.33's max_num_batched_tokens for `vllm serve` on H200
# FlashMLA's sparse kernels on Hopper compute whole 64-head tiles (vLLM pads the queries:
# prefill to a multiple of 64, fp8 decode to 64 or 128).
FLASHMLA_HEAD_TILE = 64
# Below this many heads a GPU, vLLM attends prefill rows with the fp8 decode kernel straight
# from the paged cache; from it, with the bf16 prefill kernel over an upconverted copy.
MIN_HEADS_FOR_BF16_PREFILL = 32
LSE_BYTES = 4                   # fp32 log-sum-exp of one head's partial output
TOPK_CANDIDATE_BYTES = 8        # (score, global id) of one local top-k candidate under DCP
# Kernels of one layer's forward in vLLM 0.33 (GLM-5.3 / DeepSeek-V3.2 MoE layer, estimated from
# its source): ~20 for attention (norms, fused projections with their activation quantization,
# rope, the absorbed bmms, KV cache write, index conversion, sparse MLA), ~15 for the indexer
# (projections, quantization, key cache write and gather, logits, top-k), ~20 for the MoE
# (router, grouped top-k, dispatch, permute, quantization, two grouped GEMMs, activation,
# combine, shared expert, residual).
KERNELS_PER_LAYER = 55
# What vLLM's PCP x DCP prefill adds: the KV all-gather per layer, and per indexer layer two
# all-gathers (keys, scales) and two de-interleaves.
DCP_GATHER_KERNELS_PER_LAYER = 1
DCP_GATHER_KERNELS_PER_INDEX_LAYER = 4
# GEMM efficiency is measured at these rows a GPU ("gemmFewRows", "gemm"); between, it is
# interpolated on log(rows).
FEW_GEMM_ROWS, MANY_GEMM_ROWS = 256, 1024
FP32 = 4
DISPATCH_BYTES = 1              # EP dispatch of fp8 activations
COMBINE_BYTES = 2               # EP combine of bf16 expert outputs
BF16 = 2
# The seed benchmarked MTP with 3 draft tokens at a synthetic acceptance length of 2.99;
# other draft counts scale it per draft token unless an acceptance length is given.
ACCEPTED_PER_DRAFT = (2.99 - 1) / 3
# Share of a step's top-k rows that miss HiSparse's GPU hot buffer (docs/performance.md).
HISPARSE_MISS_FRACTION = 0.10

# Routed experts each token activates: GLM-5's and DeepSeek-V3.2's config.json
# (num_experts_per_tok), which models.py's geometry does not carry.
_EXPERTS_PER_TOKEN = {"glm-5.3": 8, "deepseek-v3.2": 8}
_GEOMETRY = {"glm-5.3": models._GLM_5_3, "deepseek-v3.2": models._DEEPSEEK_V3_2}


# ------------------------------------------------------------ the model's shape


@dataclass(frozen=True)
class Shape:
    """What the model prices: layer counts, widths, and weight bytes (FP8 linear weights)."""

    layers: int                 # MLA layers, main model + MTP
    index_layers: int           # indexer layers, main model + MTP
    moe_layers: int             # layers with routed experts, main model + MTP
    heads: int
    row: int                    # fp8_ds_mla KV row (656 B)
    row_bf16: int               # the row upconverted to bf16 (1152 B); also one head's query
    index_row: int              # indexer key (132 B)
    index_flops_per_key: int    # 2 x indexHeads x indexHeadDim
    mla_flops_per_key: int      # 2176 per head
    qo_bytes_per_head: int      # bf16 query and output of one head
    top_k: int
    hidden: int
    experts: int
    experts_per_token: int
    expert_bytes: int           # one routed expert of one layer
    replicated_bytes: int       # linear weights expert parallelism does not split
    lm_head_bytes: int          # bf16


def model_shape(spec: LongContextDeploymentSpec) -> Optional[Shape]:
    """The shape of a preset; None for an explicit architecture, which lacks the widths
    (hidden size, experts) that price the projections and experts."""
    if spec.model.architecture is not None or spec.model.preset not in _GEOMETRY:
        return None
    arch = models.resolve_architecture(spec.model)
    g = _GEOMETRY[spec.model.preset]
    _, other, _ = g.parameters()
    dtype = spec.engine.kvCacheDtype
    return Shape(
        layers=arch.layers + arch.mtpLayers, index_layers=arch.indexLayers + arch.mtpLayers,
        moe_layers=g.layers - g.dense_layers + g.mtp_layers, heads=arch.attentionHeads,
        row=models.mla_row_bytes(arch, dtype), row_bf16=models.mla_row_bytes(arch, "auto"),
        index_row=models.indexer_row_bytes(arch),
        index_flops_per_key=2 * arch.indexHeads * arch.indexHeadDim,
        mla_flops_per_key=planner.flops_per_row_per_head(arch),
        qo_bytes_per_head=planner.query_output_bytes_per_head(arch), top_k=arch.indexTopK,
        hidden=g.hidden, experts=g.routed_experts,
        experts_per_token=_EXPERTS_PER_TOKEN[spec.model.preset],
        expert_bytes=3 * g.hidden * g.moe_intermediate, replicated_bytes=other,
        lm_head_bytes=g.vocab * g.hidden * BF16)


# ------------------------------------------------------------ costs


@dataclass
class Costs:
    """Seconds by term and by category (compute, HBM, interconnect, PCIe, launch)."""

    terms: dict[str, float] = field(default_factory=dict)
    categories: dict[str, float] = field(default_factory=dict)

    def add(self, term: str, seconds: float, category: str) -> None:
        self.terms[term] = self.terms.get(term, 0.0) + seconds
        self.categories[category] = self.categories.get(category, 0.0) + seconds

    def kernel(self, term: str, hw: HardwareProfile, flops: float, rate: float,
               compute_eff: float, hbm_bytes: float, hbm_eff: float) -> None:
        compute = flops / (rate * compute_eff)
        memory = hbm_bytes / (hw.hbmBytesPerS * hbm_eff)
        self.add(term, max(compute, memory), "compute" if compute >= memory else "HBM")

    def link(self, term: str, hw: HardwareProfile, link_bytes: float, collectives: float) -> None:
        self.add(term, link_bytes / hw.nvlinkBytesPerS + collectives * hw.collectiveLatencyS,
                 "interconnect")

    @property
    def seconds(self) -> float:
        return sum(self.terms.values())

    @property
    def bound(self) -> str:
        return max(self.categories, key=self.categories.get) if self.categories else "-"


def _gemm_eff(hw: HardwareProfile, rows: float) -> float:
    """Fraction of the fp8 rate a GEMM of `rows` rows a GPU reaches: few rows leave SMs idle."""
    few, many = hw.eff("gemmFewRows"), hw.eff("gemm")
    if rows <= FEW_GEMM_ROWS:
        return few
    if rows >= MANY_GEMM_ROWS:
        return many
    return few + (many - few) * math.log(rows / FEW_GEMM_ROWS) / math.log(
        MANY_GEMM_ROWS / FEW_GEMM_ROWS)


def _touched_experts(shape: Shape, assignments: float) -> float:
    """Expected share of experts that `assignments` uniform token-to-expert routings touch."""
    return 1.0 - (1.0 - 1.0 / shape.experts) ** assignments


def _experts(costs: Costs, shape: Shape, layout: Any, hw: HardwareProfile,
             group_tokens: float) -> None:
    """Routed experts of every MoE layer for `group_tokens` tokens over the expert-parallel
    group: the GPU's share of the expert GEMMs reads the weights of the local experts the
    batch touches. vLLM 0.33's default all2all backend (allgather_reducescatter) then moves
    every token to every GPU: dispatch all-gathers the fp8-quantized activations, combine
    reduce-scatters the bf16 expert outputs."""
    split = layout.expert_split
    assignments = group_tokens * shape.experts_per_token
    local = shape.experts / split
    costs.kernel("experts", hw,
                 2 * shape.expert_bytes * assignments / split * shape.moe_layers,
                 hw.fp8FlopsPerS, hw.eff("gemm"),
                 local * _touched_experts(shape, assignments) * shape.expert_bytes
                 * shape.moe_layers, hw.eff("expertGemm"))
    if layout.expertParallel and split > 1:
        moved = (split - 1) / split * group_tokens * shape.hidden \
            * (DISPATCH_BYTES + COMBINE_BYTES)
        costs.link("epAllToAll", hw, moved * shape.moe_layers, 2 * shape.moe_layers)


def _padded_heads(heads: float) -> int:
    return math.ceil(heads / FLASHMLA_HEAD_TILE) * FLASHMLA_HEAD_TILE


def _dcp_query_exchange(costs: Costs, shape: Shape, hw: HardwareProfile, query_rows: float,
                        heads: float, dcp: int, layers: int, index_layers: int) -> None:
    """DCP with the KV sharded by token (`ag_rs`): per layer, each GPU all-gathers the
    group's absorbed queries, attends its shard, all-gathers the partial outputs' LSEs and
    reduce-scatters the rescaled outputs; per indexer layer it all-gathers each rank's local
    top-k candidates. `heads` are the group's (what each GPU attends after the gather)."""
    arch_out = shape.qo_bytes_per_head - shape.row_bf16   # bf16 output of one head
    per_layer = query_rows * (heads / dcp * shape.row_bf16 * (dcp - 1)
                              + heads * LSE_BYTES * (dcp - 1) / dcp
                              + heads * arch_out * (dcp - 1) / dcp)
    candidates = query_rows * (dcp - 1) * shape.top_k * TOPK_CANDIDATE_BYTES
    costs.link("dcpCombine", hw, per_layer * layers + candidates * index_layers,
               3 * layers + index_layers)


def _tp_all_reduce(costs: Costs, shape: Shape, layout: Any, hw: HardwareProfile,
                   tokens: float) -> None:
    tp = layout.tensorParallel
    if tp > 1:
        costs.link("tpAllReduce", hw, 2 * (tp - 1) / tp * tokens * shape.hidden * BF16
                   * shape.layers, shape.layers)


def _launches(costs: Costs, kernels: float, per_kernel: float) -> None:
    costs.add("launches", kernels * per_kernel, "launch")


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
                 hw.fp8FlopsPerS, _gemm_eff(hw, queries), shape.replicated_bytes / tp,
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
        costs.kernel("sparseMla", hw, shape.mla_flops_per_key * _padded_heads(group_heads)
                     * keys / dcp * shape.layers, hw.bf16FlopsPerS, hw.eff("sparseMlaDecode"),
                     keys / dcp * (shape.row + planner.INDEX_BYTES) * shape.layers,
                     hw.eff("hbm"))
        if dcp > 1:
            _dcp_query_exchange(costs, shape, hw, queries, group_heads, dcp,
                                shape.layers, shape.index_layers)
    else:
        costs.kernel("sparseMla", hw, shape.mla_flops_per_key * _padded_heads(heads) * keys
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
    _experts(costs, shape, layout, hw, group_tokens=tokens)
    _tp_all_reduce(costs, shape, layout, hw, tokens)
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
    _launches(costs, kernels, hw.eagerKernelS)
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
    bpt = planner.kv_bytes_per_token(arch, spec.engine.kvCacheDtype)
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
                 hw.fp8FlopsPerS, _gemm_eff(hw, tokens), shape.replicated_bytes * share / tp,
                 hw.eff("hbm"))
    heads = min(shape.heads, shape.heads // tp * dcp)   # after the DCP query gather
    keys = shape.top_k / dcp
    costs.kernel("sparseMla", hw, shape.mla_flops_per_key * _padded_heads(heads) * keys
                 * tokens * layers.layers,
                 hw.bf16FlopsPerS, hw.eff("sparseMlaDecode"),
                 tokens * (keys * (shape.row + planner.INDEX_BYTES)
                           + heads * shape.qo_bytes_per_head) * layers.layers, hw.eff("hbm"))
    local = context / dcp   # each request's keys are read once for all its query rows
    costs.kernel("indexer", hw, shape.index_flops_per_key * local * tokens * layers.index_layers,
                 hw.fp8FlopsPerS, hw.eff("gemm"),
                 (batch * local * shape.index_row + 2 * 4 * local * tokens)
                 * layers.index_layers, hw.eff("indexerDecode"))
    per_gpu = tokens / tp
    _experts(costs, layers, layout, hw, group_tokens=per_gpu * layout.expert_split)
    _tp_all_reduce(costs, layers, layout, hw, tokens)
    if dcp > 1:
        _dcp_query_exchange(costs, shape, hw, tokens, heads, dcp, layers.layers,
                            layers.index_layers)
    costs.kernel("lmHead", hw, 2 * shape.lm_head_bytes / BF16 / tp * tokens, hw.bf16FlopsPerS,
                 _gemm_eff(hw, tokens), shape.lm_head_bytes / tp, hw.eff("hbm"))
    _launches(costs, KERNELS_PER_LAYER * layers.layers, hw.kernelLaunchS)   # a CUDA graph


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
    if workload.output_tokens:
        out["requestSeconds"] = round(ttft + workload.output_tokens / per_user, 3) \
            if per_user else None
    return out


def summary_at_max_context(spec: LongContextDeploymentSpec,
                           hardware: Optional[HardwareProfile] = None) -> Optional[dict[str, Any]]:
    """The prediction at maxContextTokens for status.plan: a whole max-context prompt from
    scratch, its KV transfer, and decode at that context with as many requests as the decode
    role holds (at least one). None when the model cannot price the architecture."""
    tokens = spec.maxContextTokens
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
