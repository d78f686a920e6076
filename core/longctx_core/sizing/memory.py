"""Host memory of one engine pod: /dev/shm and the pod's memory request (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from longctx_core.sizing import cpu_platform, models
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.api.model_types import Architecture
from longctx_core.sizing.layout import Layout
from longctx_core.quantity import AUTO, GiB, parse_bytes

SHM_BASE_MARGIN = 4 * GiB        # NCCL SHM transport FIFOs, vLLM shm_broadcast rings, torch IPC
SHM_MARGIN_PER_GPU = 1 * GiB
RSS_PER_GPU_WORKER = 12 * GiB    # CUDA context, torch, NCCL/NIXL/UCX registrations, JIT caches
RSS_PER_ENGINE_RANK = 4 * GiB    # API server + engine core + scheduler of one DP rank
RSS_POD_BASE = 16 * GiB          # supervisor, tokenizer, page cache headroom while loading weights

BLOCK_TOKENS = 64           # vLLM's KV page for sparse MLA + indexer on H200
HISPARSE_SPARE_PAGES = 2    # the host pool's null block + copy-on-write tail


def hisparse_enabled(spec: LongContextDeploymentSpec, role: str) -> bool:
    return role == "decode" and spec.decode.hiSparse.enabled


def hisparse_page_bytes(arch: Architecture, kv_cache_dtype: str = "fp8") -> int:
    """One 64-token host page of the HiSparse source group: every MLA layer's rows
    (main + MTP), not the indexer keys, which stay on the GPU."""
    return (arch.layers + arch.mtpLayers) * BLOCK_TOKENS * models.mla_row_bytes(arch, kv_cache_dtype)


def hisparse_min_pool_bytes(arch: Architecture, tokens: int, kv_cache_dtype: str = "fp8",
                            requests: int = 1) -> int:
    """Smallest host pool (host_pool_gib, in bytes) that holds `requests` requests of `tokens`:
    vLLM accepts a pool of cdiv(max_model_len, 64) + 2 pages, one request's pages and the
    spares; each further request takes cdiv(max_model_len, 64) more."""
    pages = requests * -(-tokens // BLOCK_TOKENS) + HISPARSE_SPARE_PAGES
    return pages * hisparse_page_bytes(arch, kv_cache_dtype)


def hisparse_pool_per_rank(spec: LongContextDeploymentSpec) -> int:
    """Bytes of one decode rank's HiSparse host pool: spec.decode.hiSparse.hostPoolPerRank,
    or for `auto` the least pool that holds requestsPerRank max-context requests. The
    capacity plan calls it once (planner.HiSparseCapacity.host_pool_bytes); the pod's
    memory, host_pool_gib and the capacity rules read the plan's figure."""
    hs = spec.decode.hiSparse
    if hs.hostPoolPerRank == AUTO:
        return hisparse_min_pool_bytes(models.resolve_architecture(spec.model),
                                       spec.maxContextTokens, spec.engine.kvCacheDtype,
                                       hs.requestsPerRank)
    return parse_bytes(hs.hostPoolPerRank, "spec.decode.hiSparse.hostPoolPerRank")


@dataclass(frozen=True)
class PodMemory:
    """Bytes of one pod of a role."""

    offload_per_rank: int     # OffloadingConnector cpu_bytes_to_use of one rank
    shm: int                  # the /dev/shm emptyDir's size limit
    request: int              # the pod's memory request and limit


def pod_memory(spec: LongContextDeploymentSpec, layout: Layout, hisparse_pool: int
               ) -> PodMemory:
    """Memory of one pod; `hisparse_pool`: one decode rank's HiSparse host pool, as the
    capacity plan resolved it (pinned by each rank of a HiSparse decode pod).

    /dev/shm: each engine rank's OffloadingConnector maps
    `/dev/shm/vllm_offload_<engine_id>.mmap` of up to cpu_bytes_to_use bytes, and vLLM
    refuses to start when /dev/shm has less free space. On top: 4 GiB + 1 GiB per GPU for
    NCCL's SHM transport buffers between local ranks, vLLM's shm_broadcast rings (one set
    per rank) and torch multiprocessing tensors. llm-d's wide-EP guide measured ~32 MB per
    local DP rank for the latter two, so the margin is generous on purpose: running out
    aborts a load that took tens of minutes.

    The pod's request: the /dev/shm pages are tmpfs and are charged to the pod's memory
    cgroup; every HiSparse decode rank pins its own host pool (no pool is shared at TP1);
    process RSS is 12 GiB per GPU worker (CUDA context, torch, NCCL/NIXL/UCX registrations,
    Triton/DeepGEMM JIT), 4 GiB per engine rank (API server, engine core, scheduler,
    detokenizer) and 16 GiB per pod (supervisor, tokenizer, page-cache headroom while
    safetensors are read).
    """
    role = layout.role
    if cpu_platform.is_cpu(spec):
        weights = models.resolve_architecture(spec.model).parameterBytes
        kv = cpu_platform.kv_cache_space_gib(spec) * GiB
        request = kv + cpu_platform.ENGINE_RSS + (parse_bytes(weights) if weights else 0)
        return PodMemory(offload_per_rank=0, shm=cpu_platform.SHM, request=request)
    offload = parse_bytes(getattr(spec, role).cpuOffloadPerRank, f"spec.{role}.cpuOffloadPerRank")
    pool = hisparse_pool if hisparse_enabled(spec, role) else 0
    n = layout.ranks_per_pod
    shm = n * offload + SHM_BASE_MARGIN + SHM_MARGIN_PER_GPU * layout.gpusPerPod
    request = (n * offload + n * pool + RSS_PER_GPU_WORKER * layout.gpusPerPod
               + RSS_PER_ENGINE_RANK * n + RSS_POD_BASE)
    return PodMemory(offload_per_rank=offload, shm=shm, request=request)
