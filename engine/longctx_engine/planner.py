"""The KV capacity planner: pure functions from (architecture, GPU, layout) to a plan.

`plan(spec)` proves, before any GPU is spent, that the layout of a
LongContextDeployment holds `maxContextTokens` on both roles, or says what to
change. Everything is derived from the architecture numbers (api.Architecture)
and vLLM 0.33's memory rules (docs/vllm.md#bytes-per-token and
docs/kernels.md); nothing here is a stored answer. Stdlib only.

Modelling choices (each also noted where it is made):
* KV per GPU. MLA's latent KV is shared by all heads, so tensor parallelism (TP)
  and prefill context parallelism (PCP) replicate it; decode context parallelism
  (DCP) shards it by token (vLLM sizes a rank for cdiv(max_model_len, DCP) tokens);
  data parallelism (DP) keeps a whole request on one rank; pipeline parallelism
  (PP) splits the layers.
* KV budget per GPU = gpuMemory x utilisation - weights per GPU - activation
  reserve - sparse-MLA prefill workspace, unless spec.capacity.kvBudgetPerGpu
  overrides it. Weights per GPU = replicatedParameterBytes / TP + (the rest) /
  expert-parallel group (DP x TP x PCP GPUs of one engine), all / PP. Without
  replicatedParameterBytes all weights are divided by the expert-parallel group
  (optimistic: attention weights are in fact on every GPU).
* HiSparse (decode): only the MLA rows live in the pinned host pool, which must
  hold every page of every admitted request (vLLM: host_num_blocks >=
  cdiv(max_model_len, 64) + 2, else "increase host_pool_gib"); the indexer keys
  and the per-request hot buffer stay on the GPU.
* Offload-only decode: the OffloadingConnector's CPU tier keeps prefix copies;
  attention reads GPU pages, so a request must fit in GPU KV by itself.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from . import cpu_platform, models
from .api import Architecture, LongContextDeploymentSpec
from .layout import Layout, role_layout, role_layouts
from .memory import (BLOCK_TOKENS, HISPARSE_SPARE_PAGES, hisparse_enabled,
                     hisparse_min_pool_bytes, hisparse_page_bytes, hisparse_pool_per_rank,
                     pod_memory)
from .quantity import AUTO, GiB, MiB, parse_bytes

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


# ------------------------------------------------------------ host memory of the nodes

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# GPU feature discovery's label: one GPU's memory in MiB.
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"


@dataclass(frozen=True)
class NodeMemory:
    """What the planner needs of one node: its labels and allocatable host memory."""

    name: str
    labels: dict[str, str]
    allocatable: int

    @classmethod
    def from_manifest(cls, node: dict[str, Any]) -> Optional["NodeMemory"]:
        """A Node object as the API returns it; None when its memory is not a quantity."""
        meta = node.get("metadata") or {}
        try:
            memory = parse_bytes(((node.get("status") or {}).get("allocatable") or {})
                                 .get("memory", ""), "allocatable memory")
        except ValueError:
            return None
        return cls(meta.get("name", ""), dict(meta.get("labels") or {}), memory)

    @property
    def gpu_memory(self) -> Optional[int]:
        value = self.labels.get(GPU_MEMORY_LABEL, "")
        return int(value) * MiB if value.isdigit() else None


def placement_nodes(spec: LongContextDeploymentSpec, nodes: list[NodeMemory]
                    ) -> list[NodeMemory]:
    """The nodes the engine pods' node affinity and nodeSelector allow."""
    wanted = {GPU_PRODUCT_LABEL: spec.placement.gpuProduct, **spec.placement.nodeSelector}
    return [n for n in nodes if all(n.labels.get(k) == v for k, v in wanted.items())]


def _placement_text(spec: LongContextDeploymentSpec) -> str:
    wanted = {GPU_PRODUCT_LABEL: spec.placement.gpuProduct, **spec.placement.nodeSelector}
    return ", ".join(f"{k}={v}" for k, v in wanted.items())


def _host_memory_fix(spec: LongContextDeploymentSpec, role: str, need: int,
                     allocatable: int) -> tuple[str, str]:
    """The spec field that holds most of one pod's host memory (with its value), and the
    change of it that makes the pod fit `allocatable`."""
    r = getattr(spec, role)
    fields = [(parse_bytes(r.cpuOffloadPerRank), f"spec.{role}.cpuOffloadPerRank",
               r.cpuOffloadPerRank)]
    hs = spec.decode.hiSparse
    if hisparse_enabled(spec, role):
        pool = hisparse_pool_per_rank(spec)
        fields.append((pool, "spec.decode.hiSparse.hostPoolPerRank",
                       f"{hs.hostPoolPerRank} = {_gib(pool)} GiB" if hs.hostPoolPerRank == AUTO
                       else hs.hostPoolPerRank))
    size, name, value = max(fields)
    fit = size - -(-(need - allocatable) // role_layout(spec, role).ranks_per_pod)
    if name.endswith("hostPoolPerRank") and hs.hostPoolPerRank == AUTO:
        arch = models.resolve_architecture(spec.model)
        requests = hisparse_host_requests(arch, max(fit, 0), spec.maxContextTokens,
                                          spec.engine.kvCacheDtype)
        if requests >= 1:
            return (f"{name} ({value})", "lower spec.decode.hiSparse.requestsPerRank "
                    f"({hs.requestsPerRank}) to at most {requests}")
    elif fit >= GiB:
        return f"{name} ({value})", f"lower it to at most {fit // GiB}Gi"
    return (f"{name} ({value})", "no value of it alone fits: lower the other host memory "
            "fields or the ranks per pod, or use nodes with more memory")


def host_memory(spec: LongContextDeploymentSpec, nodes: Optional[list[NodeMemory]]
                ) -> tuple[dict[str, Any], Optional[str], Optional[str]]:
    """Each role's pod memory (CPU offload in /dev/shm, HiSparse pinned pools, process RSS
    and page-cache headroom: memory.pod_memory) and one GPU's memory against the nodes the
    placement selects. Returns (the plan's hostMemory object, a refusal, a note); `nodes`
    None means no node list (offline, or no permission to list nodes): nothing is checked."""
    pods = {role: pod_memory(spec, role_layout(spec, role)).request
            for role in ("prefill", "decode")}
    out: dict[str, Any] = {f"{role}PodGiB": _gib(need) for role, need in pods.items()}
    if nodes is None:
        out["checked"] = False
        return out, None, ("host memory per pod was not checked against the nodes (no node "
                           "list: offline, or the operator may not list nodes)")
    selected = placement_nodes(spec, nodes)
    out.update(checked=bool(selected), nodes=len(selected))
    if not selected:
        return out, None, (f"no node matches the placement ({_placement_text(spec)}); host "
                           "memory per pod was not checked")
    largest = max(selected, key=lambda n: n.allocatable)
    out["largestAllocatableGiB"] = _gib(largest.allocatable)
    problems = []
    for role, need in pods.items():
        if need > largest.allocatable:
            field, change = _host_memory_fix(spec, role, need, largest.allocatable)
            problems.append(
                f"{field} makes each {role} pod need {_gib(need)} GiB "
                f"of host memory (CPU offload, HiSparse pools, /dev/shm and process memory), "
                f"but the largest node the placement selects ({largest.name}, "
                f"{_placement_text(spec)}) has {_gib(largest.allocatable)} GiB allocatable: "
                f"{change}")
    gpu_sizes = [n.gpu_memory for n in selected if n.gpu_memory is not None]
    gpu = parse_bytes(spec.capacity.gpuMemory, "spec.capacity.gpuMemory")
    if gpu_sizes and gpu > max(gpu_sizes):
        problems.append(
            f"spec.capacity.gpuMemory ({spec.capacity.gpuMemory}, {_gib(gpu)} GiB) is more than "
            f"the largest GPU of the selected nodes ({_gib(max(gpu_sizes))} GiB, label "
            f"{GPU_MEMORY_LABEL}): set it to at most {max(gpu_sizes)}, or to what "
            "torch.cuda.mem_get_info reports")
    return out, ("; ".join(problems) + ".") if problems else None, None


def gpu_quantity_problems(spec: LongContextDeploymentSpec) -> list[str]:
    """Per-GPU quantities that cannot hold on any GPU of spec.capacity.gpuMemory."""
    cap = spec.capacity
    gpu = parse_bytes(cap.gpuMemory, "spec.capacity.gpuMemory")
    out = []
    if cap.kvBudgetPerGpu is not None and parse_bytes(cap.kvBudgetPerGpu) > gpu:
        out.append(f"spec.capacity.kvBudgetPerGpu ({cap.kvBudgetPerGpu}) is more than the whole "
                   f"GPU (spec.capacity.gpuMemory {cap.gpuMemory}): lower it to at most "
                   f"{cap.gpuMemory}")
    if parse_bytes(cap.activationReservePerGpu) >= gpu:
        out.append(f"spec.capacity.activationReservePerGpu ({cap.activationReservePerGpu}) "
                   f"leaves nothing of the GPU (spec.capacity.gpuMemory {cap.gpuMemory}): "
                   f"lower it below {cap.gpuMemory}")
    return out


# ------------------------------------------------------------ plan


def _gib(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value / GiB, 2)


def _ceil_gi(value: int) -> str:
    return f"{-(-value // GiB)}Gi"


@dataclass(frozen=True)
class RoleCapacity:
    role: str
    layout: Layout
    budget: Budget
    kv_bytes_per_gpu: int
    fits: bool
    max_concurrent: int
    heads_per_gpu: int
    flops_per_byte: float
    crossover_tokens: Optional[int]
    cpu_offload_bytes_per_rank: int
    cpu_offload_tokens_per_rank: int
    hisparse: Optional[dict[str, Any]] = None
    refusal: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "layout": self.layout.describe(),
            "gpus": self.layout.replicas * self.layout.gpusPerPod,
            "engineRanks": self.layout.ranks,
            "kvBudgetSource": self.budget.source,
            "weightsGiBPerGpu": _gib(self.budget.weights),
            "reserveGiBPerGpu": _gib(self.budget.reserve),
            "kvBudgetGiBPerGpu": _gib(self.budget.kv),
            "kvGiBPerGpu": _gib(self.kv_bytes_per_gpu),
            "fits": self.fits,
            "maxConcurrentAtMaxContext": self.max_concurrent,
            "headsPerGpu": self.heads_per_gpu,
            "sparseMlaFlopsPerByte": round(self.flops_per_byte, 1),
            "indexerCrossoverTokens": self.crossover_tokens,
            "cpuOffloadGiBPerRank": _gib(self.cpu_offload_bytes_per_rank),
            "cpuOffloadTokensPerRank": self.cpu_offload_tokens_per_rank,
            "cpuOffloadTokens": self.cpu_offload_tokens_per_rank * self.layout.ranks,
        }
        if self.hisparse is not None:
            out["hiSparse"] = dict(self.hisparse)
        return out


@dataclass(frozen=True)
class CapacityPlan:
    """Whether a spec's layout holds maxContextTokens, with the figures that prove it."""

    architecture: Architecture
    preset: Optional[str]
    kv_cache_dtype: str
    max_context_tokens: int
    bytes_per_token: BytesPerToken
    request_bytes: int
    prefill: RoleCapacity
    decode: RoleCapacity
    refusal: Optional[str] = None
    notes: tuple[str, ...] = field(default=())
    host_memory: dict[str, Any] = field(default_factory=dict)
    host_refusal: Optional[str] = None   # pods or GPU figures no selected node can hold

    @property
    def fits(self) -> bool:
        return self.prefill.fits and self.decode.fits and self.host_refusal is None

    @property
    def reason(self) -> str:
        """The CapacityPlanned=False reason: the KV check's, else the nodes'."""
        if self.prefill.fits and self.decode.fits:
            return "InsufficientHostMemory"
        return "InsufficientKVCapacity"

    def to_json(self) -> dict[str, Any]:
        bpt = self.bytes_per_token
        return {
            "model": {"preset": self.preset, "kvCacheDtype": self.kv_cache_dtype},
            "maxContextTokens": self.max_context_tokens,
            "kvBytesPerToken": {"mla": bpt.mla, "indexer": bpt.indexer, "mtp": bpt.mtp,
                                "total": bpt.total},
            "request": {"tokens": self.max_context_tokens, "kvBytes": self.request_bytes,
                        "kvGiB": _gib(self.request_bytes)},
            "prefill": self.prefill.to_json(),
            "decode": self.decode.to_json(),
            "hostMemory": dict(self.host_memory),
            "fits": self.fits,
            "refusal": self.refusal,
            "notes": list(self.notes),
        }


def _fits_budget(need: int, budget: Budget) -> bool:
    return budget.kv is not None and need <= budget.kv


def _budget_text(budget: Budget) -> str:
    if budget.source == "spec.capacity.kvBudgetPerGpu":
        return f"spec.capacity.kvBudgetPerGpu is {_gib(budget.kv)} GiB"
    return (f"about {_gib(budget.kv)} GiB per GPU is left for KV after weights "
            f"({_gib(budget.weights)} GiB) and activations ({_gib(budget.reserve)} GiB)")


def _max_tokens(bpt: BytesPerToken, budget: Budget, layout: Layout) -> int:
    if budget.kv is None or budget.kv <= 0:
        return 0
    return budget.kv * layout.pipelineParallel // bpt.total * layout.decodeContextParallel


def _smallest_dcp(bpt: BytesPerToken, tokens: int, budget: Budget, layout: Layout,
                  largest: int) -> Optional[int]:
    n = 1
    while n <= largest:
        trial = layout.with_dcp(n)
        if _fits_budget(kv_bytes_per_gpu(bpt, tokens, trial), budget):
            return n
        n *= 2
    return None


def _unknown_budget_refusal(role: str, need: int) -> str:
    return (f"spec.{role}: the KV budget per GPU cannot be estimated because the architecture "
            f"has no parameterBytes; set spec.capacity.kvBudgetPerGpu to at least "
            f"{_ceil_gi(need)} (what one request needs per GPU), or set "
            "spec.model.architecture.parameterBytes")


def _plan_prefill(spec: LongContextDeploymentSpec, arch: Architecture, bpt: BytesPerToken,
                  layout: Layout) -> RoleCapacity:
    tokens = spec.maxContextTokens
    budget = kv_budget_per_gpu(spec, arch, layout)
    need = kv_bytes_per_gpu(bpt, tokens, layout)
    fits = _fits_budget(need, budget)
    per_rank = budget.kv // need if fits and budget.kv is not None else 0
    refusal = None
    if budget.kv is None:
        refusal = _unknown_budget_refusal("prefill", need)
    elif not fits:
        refusal = (f"spec.prefill cannot hold one {tokens}-token request: it needs "
                   f"{_gib(need)} GiB of KV per GPU (decode context parallelism "
                   f"{layout.decodeContextParallel}) but {_budget_text(budget)}.")
        # PCP+DCP with TP 1 (vLLM 0.33 + NIXL): DCP equal to PCP, at most the GPUs of a pod.
        largest = layout.gpusPerPod // (layout.tensorParallel * layout.pipelineParallel)
        n = _smallest_dcp(bpt, tokens, budget, layout, largest)
        if n is not None:
            dp = layout.gpusPerPod // (n * layout.tensorParallel * layout.pipelineParallel)
            trial = layout.with_dcp(n)
            refusal += (f" Set spec.prefill.contextParallel.prefill and "
                        f"spec.prefill.contextParallel.decode to {n} (the smallest decode "
                        f"context parallelism that fits: {_gib(kv_bytes_per_gpu(bpt, tokens, trial))}"
                        f" GiB per GPU) and spec.prefill.dataParallel to {dp}")
            if layout.prefillContextParallel > n:
                refusal += (f" (or keep PCP{layout.prefillContextParallel} and set "
                            "spec.prefill.contextParallel.decode to "
                            f"{layout.prefillContextParallel})")
            refusal += (", or lower spec.maxContextTokens to at most "
                        f"{_max_tokens(bpt, budget, layout)}.")
        else:
            refusal += (f" Even decode context parallelism {largest} does not fit: lower "
                        f"spec.maxContextTokens to at most "
                        f"{_max_tokens(bpt, budget, layout.with_dcp(largest))}.")
        if budget.source == "estimate":
            refusal += (" If the estimate is too low for your engine, set "
                        "spec.capacity.kvBudgetPerGpu.")
    offload = parse_bytes(spec.prefill.cpuOffloadPerRank, "spec.prefill.cpuOffloadPerRank")
    heads = heads_per_gpu(arch, layout)
    return RoleCapacity(
        role="prefill", layout=layout, budget=budget, kv_bytes_per_gpu=need, fits=fits,
        max_concurrent=per_rank * layout.ranks, heads_per_gpu=heads,
        flops_per_byte=sparse_mla_flops_per_byte(arch, heads, spec.engine.kvCacheDtype),
        crossover_tokens=indexer_crossover_tokens(arch, heads),
        cpu_offload_bytes_per_rank=offload,
        # One engine rank's offload holds whole tokens (its DCP shards together).
        cpu_offload_tokens_per_rank=offload // bpt.total, refusal=refusal)


def _hisparse_gpu_fix(spec: LongContextDeploymentSpec, arch: Architecture,
                      bpt: BytesPerToken, budget: int) -> str:
    """The longest context, or the smallest hot buffer, whose HiSparse request fits `budget`
    bytes of GPU KV (the indexer keys grow with the context, the hot buffer does not)."""
    hot = hisparse_gpu_bytes_per_request(arch, dataclasses.replace(spec, maxContextTokens=0), bpt)
    per_token = (hisparse_gpu_bytes_per_request(arch, spec, bpt) - hot) // spec.maxContextTokens
    fixes = []
    if per_token and budget > hot:
        fixes.append(f"lower spec.maxContextTokens to at most {(budget - hot) // per_token}")
    rows = min((budget - per_token * spec.maxContextTokens) // hisparse_page_bytes(
        arch, spec.engine.kvCacheDtype) * BLOCK_TOKENS, HISPARSE_MAX_DEVICE_BUFFER)
    if rows >= max(arch.indexTopK, 1):
        fixes.append(f"set spec.decode.hiSparse.deviceBufferSize to at most {rows}")
    return " or ".join(fixes) or "no context fits the GPU: lower the weights per GPU (a larger " \
        "expert-parallel group) or set spec.capacity.kvBudgetPerGpu"


def _plan_decode(spec: LongContextDeploymentSpec, arch: Architecture, bpt: BytesPerToken,
                 layout: Layout) -> RoleCapacity:
    tokens = spec.maxContextTokens
    dtype = spec.engine.kvCacheDtype
    budget = kv_budget_per_gpu(spec, arch, layout)
    hs = spec.decode.hiSparse
    offload = parse_bytes(spec.decode.cpuOffloadPerRank, "spec.decode.cpuOffloadPerRank")
    heads = heads_per_gpu(arch, layout)
    refusal: Optional[str] = None
    hisparse: Optional[dict[str, Any]]
    min_pool = hisparse_min_pool_bytes(arch, tokens, dtype)
    if hs.enabled:
        pool = hisparse_pool_per_rank(spec)
        host_requests = hisparse_host_requests(arch, pool, tokens, dtype)
        gpu_per_request = hisparse_gpu_bytes_per_request(arch, spec, bpt)
        gpu_requests = budget.kv // gpu_per_request if budget.kv is not None and budget.kv > 0 \
            else 0
        per_rank = min(host_requests, gpu_requests)
        need = gpu_per_request
        fits = per_rank >= 1
        problems = []
        if host_requests < 1:
            problems.append(
                f"spec.decode.hiSparse.hostPoolPerRank ({hs.hostPoolPerRank}) holds "
                f"{pool // hisparse_page_bytes(arch, dtype)} pages of 64 tokens of MLA KV "
                f"({arch.layers + arch.mtpLayers} layers x {models.mla_row_bytes(arch, dtype)} B"
                f" per token), but one {tokens}-token request needs "
                f"{-(-tokens // BLOCK_TOKENS)} + {HISPARSE_SPARE_PAGES} pages "
                f"({_gib(min_pool)} GiB), and vLLM refuses to start with 'increase "
                f"host_pool_gib'. Set spec.decode.hiSparse.hostPoolPerRank to at least "
                f"{_ceil_gi(min_pool)} (or to auto)")
        if budget.kv is None:
            problems.append(_unknown_budget_refusal("decode", gpu_per_request))
        elif gpu_requests < 1:
            problems.append(
                f"spec.decode: a HiSparse request keeps {_gib(gpu_per_request)} GiB on the GPU "
                f"(indexer keys at full length plus its hot buffer) but {_budget_text(budget)}; "
                + _hisparse_gpu_fix(spec, arch, bpt, budget.kv))
        if problems:
            refusal = "; ".join(problems) + "."
        hisparse = {
            "enabled": True,
            "hostPoolGiBPerRank": _gib(pool),
            "hostPoolMinGiBPerRank": _gib(min_pool),
            "hostPoolRequestsPerRank": host_requests,
            "gpuGiBPerRequest": _gib(gpu_per_request),
            "gpuRequestsPerRank": gpu_requests,
        }
        # With HiSparse the OffloadingConnector offloads only the indexer group.
        offload_bpt = bpt.indexer + arch.mtpLayers * models.indexer_row_bytes(arch)
    else:
        need = kv_bytes_per_gpu(bpt, tokens, layout)
        fits = _fits_budget(need, budget)
        per_rank = budget.kv // need if fits and budget.kv is not None else 0
        hisparse = {"enabled": False, "hostPoolMinGiBPerRank": _gib(min_pool)}
        offload_bpt = bpt.total
        if budget.kv is None:
            refusal = _unknown_budget_refusal("decode", need)
        elif not fits:
            refusal = (f"spec.decode cannot hold one {tokens}-token request in GPU KV: it needs "
                       f"{_gib(need)} GiB per GPU but {_budget_text(budget)}; the CPU offload "
                       "(spec.decode.cpuOffloadPerRank) only keeps prefix copies, attention reads "
                       "GPU pages. Set spec.decode.hiSparse.enabled to true with "
                       f"spec.decode.hiSparse.hostPoolPerRank of at least {_ceil_gi(min_pool)}")
            largest = layout.gpusPerPod // (layout.pipelineParallel * layout.prefillContextParallel)
            trial_base = dataclasses.replace(layout, tensorParallel=1)
            n = _smallest_dcp(bpt, tokens, budget, trial_base, largest)
            if n is not None and n > 1:
                dp = layout.gpusPerPod // (n * layout.pipelineParallel
                                           * layout.prefillContextParallel)
                refusal += (f", or set spec.decode.tensorParallel and "
                            f"spec.decode.contextParallel.decode to {n} and "
                            f"spec.decode.dataParallel to {dp} (the smallest decode context "
                            "parallelism that fits)")
            refusal += "."
            if budget.source == "estimate":
                refusal += (" If the estimate is too low for your engine, set "
                            "spec.capacity.kvBudgetPerGpu.")
    return RoleCapacity(
        role="decode", layout=layout, budget=budget, kv_bytes_per_gpu=need, fits=fits,
        max_concurrent=per_rank * layout.ranks, heads_per_gpu=heads,
        flops_per_byte=sparse_mla_flops_per_byte(arch, heads, dtype),
        crossover_tokens=indexer_crossover_tokens(arch, heads),
        cpu_offload_bytes_per_rank=offload,
        cpu_offload_tokens_per_rank=offload // offload_bpt if offload_bpt else 0,
        hisparse=hisparse, refusal=refusal)


def plan(spec: LongContextDeploymentSpec,
         nodes: Optional[list[NodeMemory]] = None) -> CapacityPlan:
    """The capacity plan of a spec (see the module docstring for the model). `nodes`: the
    cluster's nodes, for the host-memory check; None skips it (said in the notes)."""
    arch = models.resolve_architecture(spec.model)
    dtype = spec.engine.kvCacheDtype
    bpt = kv_bytes_per_token(arch, dtype)
    prefill_layout, decode_layout = role_layouts(spec)
    prefill = _plan_prefill(spec, arch, bpt, prefill_layout)
    decode = _plan_decode(spec, arch, bpt, decode_layout)
    host, host_refusal, host_note = host_memory(spec, nodes)
    gpu_problems = gpu_quantity_problems(spec)
    if gpu_problems:
        host_refusal = "; ".join(gpu_problems + ([host_refusal.rstrip(".")] if host_refusal
                                                 else [])) + "."
    refusals = [r for r in (prefill.refusal, decode.refusal, host_refusal) if r]
    notes = [host_note] if host_note else []
    if arch.parameterBytes is not None and arch.replicatedParameterBytes is None \
            and spec.capacity.kvBudgetPerGpu is None:
        notes.append("architecture.replicatedParameterBytes is unset: all weights were divided "
                     "by the expert-parallel group, which overestimates the KV budget")
    if prefill.budget.source == "estimate":
        notes.append(f"KV budget estimated from gpuMemory {_gib(parse_bytes(spec.capacity.gpuMemory))} GiB x "
                     f"{spec.capacity.gpuMemoryUtilizationPercent}% - weights - "
                     f"activationReservePerGpu {spec.capacity.activationReservePerGpu} - "
                     "sparse-MLA prefill workspace")
    return CapacityPlan(
        architecture=arch, preset=spec.model.preset if spec.model.architecture is None else None,
        kv_cache_dtype=dtype, max_context_tokens=spec.maxContextTokens, bytes_per_token=bpt,
        request_bytes=request_kv_bytes(bpt, spec.maxContextTokens), prefill=prefill,
        decode=decode, refusal=" ".join(refusals) if refusals else None, notes=tuple(notes),
        host_memory=host, host_refusal=host_refusal)
