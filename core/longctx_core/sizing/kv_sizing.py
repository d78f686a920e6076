"""KV arithmetic of one architecture and layout: bytes per token, KV per GPU, the KV budget
per GPU, the sparse-MLA arithmetic intensity and HiSparse's host and GPU sizes. Stdlib only;
the modelling choices are listed in planner.py, which proves a layout with these numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from longctx_core.sizing import cpu_platform, models
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.api.model_types import Architecture
from longctx_core.sizing.layout import Layout
from longctx_core.sizing.memory import BLOCK_TOKENS, HISPARSE_SPARE_PAGES, hisparse_page_bytes
from longctx_core.quantity import GiB, parse_bytes

INDEX_BYTES = 4             # int32 top-k index read with each selected KV row
HISPARSE_MAX_DEVICE_BUFFER = 32768  # int16 hot-slot ids


# ------------------------------------------------------------ bytes per token


@dataclass(frozen=True)
class BytesPerToken:
    mla: int
    indexer: int
    mtp: int

    @property
    def total(self) -> int:
        return self.mla + self.indexer + self.mtp


def kv_bytes_per_token(arch: Architecture, kv_cache_dtype: str = "fp8") -> BytesPerToken:
    """KV bytes per token: MLA rows of the main layers, indexer keys of the indexer layers,
    and the MTP layers, each of which carries an MLA row and (for DSA models) an indexer key.
    GLM-5.3, FP8: 78 x 656 + 21 x 132 + 1 x (656 + 132) = 54,728."""
    row = models.mla_row_bytes(arch, kv_cache_dtype)
    idx = models.indexer_row_bytes(arch)
    return BytesPerToken(mla=arch.layers * row, indexer=arch.indexLayers * idx,
                         mtp=arch.mtpLayers * (row + idx))


def request_kv_bytes(bpt: BytesPerToken, tokens: int) -> int:
    return bpt.total * tokens


# ------------------------------------------------------------ layouts


def kv_bytes_per_gpu(bpt: BytesPerToken, tokens: int, layout: Layout) -> int:
    """KV of one `tokens`-long request on each GPU that holds it. DCP shards it by token
    (cdiv(tokens, DCP) per rank, as vLLM sizes it); TP and PCP replicate it (MLA's latent
    is shared by every head, and PCP all-gathers new KV to every rank); DP keeps it whole
    on one rank; PP splits the layers (rounded up)."""
    per_rank_tokens = -(-tokens // layout.decodeContextParallel)
    return -(-bpt.total * per_rank_tokens // layout.pipelineParallel)


# ------------------------------------------------------------ KV budget


@dataclass(frozen=True)
class Budget:
    """KV memory per GPU. `kv` is None when it cannot be estimated."""

    kv: Optional[int]
    source: str                      # "spec.capacity.kvBudgetPerGpu" | "estimate" | "unknown"
    usable: Optional[int] = None     # gpuMemory x utilisation
    weights: Optional[int] = None
    reserve: Optional[int] = None    # activation reserve + sparse prefill workspace


def sparse_prefill_workspace_bytes(arch: Architecture, max_tokens: int) -> int:
    """vLLM's sparse-MLA prefill workspace: factor x max_model_len rows of (kvLoraRank +
    rope) BF16, factor 5 up to 256K tokens and 2 above (vllm/config/vllm.py)."""
    if arch.indexTopK == 0:
        return 0
    factor = 5 if max_tokens <= 262144 else 2
    return factor * max_tokens * (arch.kvLoraRank + arch.qkRopeHeadDim) * 2


def weights_bytes_per_gpu(arch: Architecture, layout: Layout) -> Optional[int]:
    if arch.parameterBytes is None:
        return None
    total = parse_bytes(arch.parameterBytes, "spec.model.architecture.parameterBytes")
    if arch.replicatedParameterBytes is None:
        # Approximation: everything split like the experts.
        return -(-total // (layout.expert_split * layout.pipelineParallel))
    replicated = min(parse_bytes(arch.replicatedParameterBytes,
                                 "spec.model.architecture.replicatedParameterBytes"), total)
    per_stage = replicated / layout.tensorParallel + (total - replicated) / layout.expert_split
    return math.ceil(per_stage / layout.pipelineParallel)


def kv_budget_per_gpu(spec: LongContextDeploymentSpec, arch: Architecture,
                      layout: Layout) -> Budget:
    cap = spec.capacity
    if cpu_platform.is_cpu(spec):
        return Budget(cpu_platform.kv_cache_space_gib(spec) * GiB, "spec.engine.cpu.kvCacheSpace")
    if cap.kvBudgetPerGpu is not None:
        return Budget(parse_bytes(cap.kvBudgetPerGpu, "spec.capacity.kvBudgetPerGpu"),
                      "spec.capacity.kvBudgetPerGpu")
    weights = weights_bytes_per_gpu(arch, layout)
    usable = parse_bytes(cap.gpuMemory, "spec.capacity.gpuMemory") \
        * cap.gpuMemoryUtilizationPercent // 100
    reserve = (parse_bytes(cap.activationReservePerGpu, "spec.capacity.activationReservePerGpu")
               + sparse_prefill_workspace_bytes(arch, spec.maxContextTokens))
    if weights is None:
        return Budget(None, "unknown", usable, None, reserve)
    return Budget(usable - weights - reserve, "estimate", usable, weights, reserve)


# ------------------------------------------------------------ arithmetic intensity


def heads_per_gpu(arch: Architecture, layout: Layout) -> int:
    """Query heads one GPU's sparse-MLA kernel serves: TP splits the heads; DCP all-gathers
    the queries of its group (TP8 + DCP8 gathers 64); PCP keeps every head on every rank."""
    return min(arch.attentionHeads,
               (arch.attentionHeads // layout.tensorParallel) * layout.decodeContextParallel)


def flops_per_row_per_head(arch: Architecture) -> int:
    """Absorbed MLA: QK over kvLoraRank + rope dims, PV over kvLoraRank, 2 FLOPs each: 2176."""
    return 2 * (2 * arch.kvLoraRank + arch.qkRopeHeadDim)


def query_output_bytes_per_head(arch: Architecture) -> int:
    """BF16 query (kvLoraRank + rope) and BF16 output (kvLoraRank) of one head: 2176 B."""
    return 2 * (arch.kvLoraRank + arch.qkRopeHeadDim) + 2 * arch.kvLoraRank


def sparse_mla_flops_per_byte(arch: Architecture, heads: int,
                              kv_cache_dtype: str = "fp8") -> float:
    """FLOPs per byte of one query token of sparse MLA (docs/kernels.md#sparse-mla-decode): top-k rows of
    (KV row + 4-byte index) read once for all `heads`, plus each head's query and output.
    GLM-5.3: 8 heads -> 35.7 MFLOP / 1.37 MB ~ 26; 64 heads -> 285 MFLOP / 1.49 MB ~ 191."""
    if arch.indexTopK == 0 or heads == 0:
        return 0.0
    k = arch.indexTopK
    row = models.mla_row_bytes(arch, kv_cache_dtype) + INDEX_BYTES
    flops = flops_per_row_per_head(arch) * heads * k
    moved = row * k + query_output_bytes_per_head(arch) * heads
    return flops / moved


def indexer_crossover_tokens(arch: Architecture, heads: int) -> Optional[int]:
    """Prompt length L at which a from-scratch prefill's indexer FLOPs overtake sparse MLA's,
    per GPU.

    Indexer, per indexer layer: every query scores every earlier key,
        L^2/2 x indexHeads x indexHeadDim x 2.
    Sparse MLA, per MLA layer: every query attends topK keys with each head it serves,
        L x topK x heads x 2176.
    Per GPU, TP replicates the indexer on every rank but splits the heads (heads = H/TP);
    PCP (and DCP) split both by token, which cancels, leaving all H heads. So
        L* = layers x topK x heads x 2176 / (indexLayers x indexHeads x indexHeadDim).
    GLM-5.3: 32,330 at 8 heads (TP8), 258,641 at 64 (PCP8): the published ~32K and ~256K (docs/design.md#the-reference-deployment).
    Choices: the main model's layers only (78 MLA, 21 indexer; with the MTP layer added
    the figures are 31.3K and 250K); leading-order terms only (clamping the first topK
    queries' attention to their causal prefix would lower the TP8 figure by ~3%).
    """
    if arch.indexLayers == 0 or arch.indexHeads == 0 or arch.indexHeadDim == 0 \
            or arch.indexTopK == 0:
        return None
    mla = arch.layers * arch.indexTopK * heads * flops_per_row_per_head(arch)
    indexer = arch.indexLayers * arch.indexHeads * arch.indexHeadDim
    return round(mla / indexer)


# ------------------------------------------------------------ HiSparse and offload


def hisparse_host_requests(arch: Architecture, pool_bytes: int, tokens: int,
                           kv_cache_dtype: str = "fp8") -> int:
    """Max-length requests one rank's host pool holds."""
    pages = pool_bytes // hisparse_page_bytes(arch, kv_cache_dtype)
    return max((pages - HISPARSE_SPARE_PAGES) // -(-tokens // BLOCK_TOKENS), 0)


def hisparse_device_buffer_rows(arch: Architecture, spec: LongContextDeploymentSpec) -> int:
    """Hot-buffer rows per request: hiSparse.deviceBufferSize, else vLLM's default
    (max decode query length + 1) x topK, with 1 + draft tokens query rows under MTP."""
    explicit = spec.decode.hiSparse.deviceBufferSize
    if explicit is not None:
        return explicit
    sq = 1 + (spec.engine.speculative.draftTokens if spec.engine.speculative.method == "mtp" else 0)
    return min((sq + 1) * arch.indexTopK, HISPARSE_MAX_DEVICE_BUFFER)


def hisparse_gpu_bytes_per_request(arch: Architecture, spec: LongContextDeploymentSpec,
                                   bpt: BytesPerToken) -> int:
    """GPU memory a HiSparse request holds: its indexer keys at full length (main + MTP
    indexers) plus its hot buffer of MLA rows in every MLA layer."""
    tokens = spec.maxContextTokens
    indexer = (bpt.indexer + arch.mtpLayers * models.indexer_row_bytes(arch)) * tokens
    rows = hisparse_device_buffer_rows(arch, spec)
    hot = -(-rows // BLOCK_TOKENS) * hisparse_page_bytes(arch, spec.engine.kvCacheDtype)
    return indexer + hot
