"""The performance model's inputs: the constants of vLLM 0.33's kernels, the served model's
shape, and the cost terms (GEMMs, experts, collectives, kernel launches) that each phase adds
up. performance.py describes the model; phase_timing.py prices the phases with these terms."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from longctx_core.sizing import kv_sizing, models
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.hardware import HardwareProfile

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
        mla_flops_per_key=kv_sizing.flops_per_row_per_head(arch),
        qo_bytes_per_head=kv_sizing.query_output_bytes_per_head(arch), top_k=arch.indexTopK,
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


def gemm_efficiency(hw: HardwareProfile, rows: float) -> float:
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


def add_experts(costs: Costs, shape: Shape, layout: Any, hw: HardwareProfile,
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


def padded_heads(heads: float) -> int:
    return math.ceil(heads / FLASHMLA_HEAD_TILE) * FLASHMLA_HEAD_TILE


def dcp_query_exchange(costs: Costs, shape: Shape, hw: HardwareProfile, query_rows: float,
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


def add_tp_all_reduce(costs: Costs, shape: Shape, layout: Any, hw: HardwareProfile,
                   tokens: float) -> None:
    tp = layout.tensorParallel
    if tp > 1:
        costs.link("tpAllReduce", hw, 2 * (tp - 1) / tp * tokens * shape.hidden * BF16
                   * shape.layers, shape.layers)


def add_launches(costs: Costs, kernels: float, per_kernel: float) -> None:
    costs.add("launches", kernels * per_kernel, "launch")
