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
from dataclasses import dataclass, field
from typing import Any, Optional

from longctx_core.sizing import models
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.api.model_types import Architecture
from longctx_core.sizing.host_memory import NodeMemory, gpu_quantity_problems, host_memory
from longctx_core.sizing.kv_sizing import (HISPARSE_MAX_DEVICE_BUFFER, Budget, BytesPerToken,
                        heads_per_gpu, hisparse_gpu_bytes_per_request, hisparse_host_requests,
                        indexer_crossover_tokens, kv_budget_per_gpu, kv_bytes_per_gpu,
                        kv_bytes_per_token, request_kv_bytes, sparse_mla_flops_per_byte)
from longctx_core.sizing.layout import Layout, role_layouts
from longctx_core.sizing.memory import (BLOCK_TOKENS, HISPARSE_SPARE_PAGES, hisparse_min_pool_bytes,
                     hisparse_page_bytes, hisparse_pool_per_rank)
from longctx_core.quantity import GiB, gib, parse_bytes


def _ceil_gi(value: int) -> str:
    return f"{-(-value // GiB)}Gi"


@dataclass(frozen=True)
class HiSparseCapacity:
    """What one decode rank's HiSparse holds. The pool is spec.decode.hiSparse.hostPoolPerRank
    with `auto` resolved (memory.hisparse_pool_per_rank); without HiSparse only the least
    pool that would hold one max-context request is known."""

    enabled: bool
    host_pool_min_bytes: int        # vLLM's least host_pool_gib for one max-context request
    host_pool_bytes: int = 0
    host_pool_requests: int = 0     # max-context requests the host pool holds
    gpu_bytes_per_request: int = 0  # indexer keys at full length plus the hot buffer
    gpu_requests: int = 0           # requests the GPU's KV budget holds

    def to_json(self) -> dict[str, Any]:
        if not self.enabled:
            return {"enabled": False, "hostPoolMinGiBPerRank": gib(self.host_pool_min_bytes)}
        return {"enabled": True, "hostPoolGiBPerRank": gib(self.host_pool_bytes),
                "hostPoolMinGiBPerRank": gib(self.host_pool_min_bytes),
                "hostPoolRequestsPerRank": self.host_pool_requests,
                "gpuGiBPerRequest": gib(self.gpu_bytes_per_request),
                "gpuRequestsPerRank": self.gpu_requests}


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
    hisparse: Optional[HiSparseCapacity] = None
    refusal: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "layout": self.layout.describe(),
            "gpus": self.layout.replicas * self.layout.gpusPerPod,
            "engineRanks": self.layout.ranks,
            "kvBudgetSource": self.budget.source,
            "weightsGiBPerGpu": gib(self.budget.weights),
            "reserveGiBPerGpu": gib(self.budget.reserve),
            "kvBudgetGiBPerGpu": gib(self.budget.kv),
            "kvGiBPerGpu": gib(self.kv_bytes_per_gpu),
            "fits": self.fits,
            "maxConcurrentAtMaxContext": self.max_concurrent,
            "headsPerGpu": self.heads_per_gpu,
            "sparseMlaFlopsPerByte": round(self.flops_per_byte, 1),
            "indexerCrossoverTokens": self.crossover_tokens,
            "cpuOffloadGiBPerRank": gib(self.cpu_offload_bytes_per_rank),
            "cpuOffloadTokensPerRank": self.cpu_offload_tokens_per_rank,
            "cpuOffloadTokens": self.cpu_offload_tokens_per_rank * self.layout.ranks,
        }
        if self.hisparse is not None:
            out["hiSparse"] = self.hisparse.to_json()
        return out

    @property
    def hisparse_pool_bytes(self) -> int:
        """One rank's HiSparse host pool (0 without HiSparse)."""
        return self.hisparse.host_pool_bytes if self.hisparse is not None else 0


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
                        "kvGiB": gib(self.request_bytes)},
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
        return f"spec.capacity.kvBudgetPerGpu is {gib(budget.kv)} GiB"
    return (f"about {gib(budget.kv)} GiB per GPU is left for KV after weights "
            f"({gib(budget.weights)} GiB) and activations ({gib(budget.reserve)} GiB)")


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
                   f"{gib(need)} GiB of KV per GPU (decode context parallelism "
                   f"{layout.decodeContextParallel}) but {_budget_text(budget)}.")
        # PCP+DCP with TP 1 (vLLM 0.33 + NIXL): DCP equal to PCP, at most the GPUs of a pod.
        largest = layout.gpusPerPod // (layout.tensorParallel * layout.pipelineParallel)
        n = _smallest_dcp(bpt, tokens, budget, layout, largest)
        if n is not None:
            dp = layout.gpusPerPod // (n * layout.tensorParallel * layout.pipelineParallel)
            trial = layout.with_dcp(n)
            refusal += (f" Set spec.prefill.contextParallel.prefill and "
                        f"spec.prefill.contextParallel.decode to {n} (the smallest decode "
                        f"context parallelism that fits: {gib(kv_bytes_per_gpu(bpt, tokens, trial))}"
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
                 layout: Layout, pool: int) -> RoleCapacity:
    tokens = spec.maxContextTokens
    dtype = spec.engine.kvCacheDtype
    budget = kv_budget_per_gpu(spec, arch, layout)
    hs = spec.decode.hiSparse
    offload = parse_bytes(spec.decode.cpuOffloadPerRank, "spec.decode.cpuOffloadPerRank")
    heads = heads_per_gpu(arch, layout)
    refusal: Optional[str] = None
    hisparse: HiSparseCapacity
    min_pool = hisparse_min_pool_bytes(arch, tokens, dtype)
    if hs.enabled:
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
                f"({gib(min_pool)} GiB), and vLLM refuses to start with 'increase "
                f"host_pool_gib'. Set spec.decode.hiSparse.hostPoolPerRank to at least "
                f"{_ceil_gi(min_pool)} (or to auto)")
        if budget.kv is None:
            problems.append(_unknown_budget_refusal("decode", gpu_per_request))
        elif gpu_requests < 1:
            problems.append(
                f"spec.decode: a HiSparse request keeps {gib(gpu_per_request)} GiB on the GPU "
                f"(indexer keys at full length plus its hot buffer) but {_budget_text(budget)}; "
                + _hisparse_gpu_fix(spec, arch, bpt, budget.kv))
        if problems:
            refusal = "; ".join(problems) + "."
        hisparse = HiSparseCapacity(
            enabled=True, host_pool_min_bytes=min_pool, host_pool_bytes=pool,
            host_pool_requests=host_requests, gpu_bytes_per_request=gpu_per_request,
            gpu_requests=gpu_requests)
        # With HiSparse the OffloadingConnector offloads only the indexer group.
        offload_bpt = bpt.indexer + arch.mtpLayers * models.indexer_row_bytes(arch)
    else:
        need = kv_bytes_per_gpu(bpt, tokens, layout)
        fits = _fits_budget(need, budget)
        per_rank = budget.kv // need if fits and budget.kv is not None else 0
        hisparse = HiSparseCapacity(enabled=False, host_pool_min_bytes=min_pool)
        offload_bpt = bpt.total
        if budget.kv is None:
            refusal = _unknown_budget_refusal("decode", need)
        elif not fits:
            refusal = (f"spec.decode cannot hold one {tokens}-token request in GPU KV: it needs "
                       f"{gib(need)} GiB per GPU but {_budget_text(budget)}; the CPU offload "
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
    # The one place the HiSparse pool becomes bytes; everything after reads the plan's.
    pool = hisparse_pool_per_rank(spec) if spec.decode.hiSparse.enabled else 0
    decode = _plan_decode(spec, arch, bpt, decode_layout, pool)
    host, host_refusal, host_note = host_memory(spec, nodes, pool)
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
        notes.append(f"KV budget estimated from gpuMemory {gib(parse_bytes(spec.capacity.gpuMemory))} GiB x "
                     f"{spec.capacity.gpuMemoryUtilizationPercent}% - weights - "
                     f"activationReservePerGpu {spec.capacity.activationReservePerGpu} - "
                     "sparse-MLA prefill workspace")
    return CapacityPlan(
        architecture=arch, preset=spec.model.preset if spec.model.architecture is None else None,
        kv_cache_dtype=dtype, max_context_tokens=spec.maxContextTokens, bytes_per_token=bpt,
        request_bytes=request_kv_bytes(bpt, spec.maxContextTokens), prefill=prefill,
        decode=decode, refusal=" ".join(refusals) if refusals else None, notes=tuple(notes),
        host_memory=host, host_refusal=host_refusal)
