"""What one pod of a role needs from its host, rendered into the launch document so that
the launcher checks it before `vllm serve` loads the model (launch.Requirement)."""

from __future__ import annotations

from longctx_core.sizing import cpu_platform
from longctx_core.launch import Requirement
from longctx_core.quantity import GiB
from longctx_core.plan.roles import RolePlan


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def host_requirements(plan: RolePlan) -> list[Requirement]:
    spec, role, lay, memory = plan.spec, plan.role, plan.layout, plan.memory
    out = []
    if not cpu_platform.is_cpu(spec):
        need = lay.ranks_per_pod * lay.gpus_per_rank
        out.append(Requirement(
            "gpus", need,
            f"{lay.ranks_per_pod} rank(s) x {lay.gpus_per_rank} GPU(s) (tensorParallel x "
            f"pipelineParallel x contextParallel.prefill of spec.{role}) = {need}",
            f"request nvidia.com/gpu: {need} on the container, or lower "
            f"spec.{role}.gpusPerPod / the parallel sizes"))
    n, offload = lay.ranks_per_pod, memory.offload_per_rank
    if offload:
        out.append(Requirement(
            "shm", n * offload,
            f"{n} rank(s) x {_gib(offload)} CPU offload (spec.{role}.cpuOffloadPerRank) = "
            f"{_gib(n * offload)}",
            f"mount /dev/shm as an emptyDir with medium Memory and sizeLimit of at least "
            f"{_gib(memory.shm)}, or lower spec.{role}.cpuOffloadPerRank"))
    elif cpu_platform.is_cpu(spec):
        out.append(Requirement(
            "shm", cpu_platform.SHM_NEED, f"vLLM's shared-memory rings between its processes "
            f"({_gib(cpu_platform.SHM_NEED)})", f"mount /dev/shm as an emptyDir with medium "
            f"Memory and sizeLimit of at least {_gib(memory.shm)}"))
    pool = plan.capacity.hisparse_pool_bytes if plan.hisparse else 0
    pools = n * pool
    parts, fields = [], []
    if pools:
        parts.append(f"HiSparse pins {n} x {_gib(pool)} = {_gib(pools)} "
                     "(spec.decode.hiSparse.hostPoolPerRank)")
        fields.append("spec.decode.hiSparse.hostPoolPerRank")
    if offload:
        parts.append(f"the CPU offload holds {n} x {_gib(offload)} = {_gib(n * offload)} "
                     f"(spec.{role}.cpuOffloadPerRank)")
        fields.append(f"spec.{role}.cpuOffloadPerRank")
    if cpu_platform.is_cpu(spec):
        space = cpu_platform.kv_cache_space_gib(spec) * GiB
        parts.append(f"the KV cache takes {_gib(space)} (spec.engine.cpu.kvCacheSpace)")
        fields.append("spec.engine.cpu.kvCacheSpace")
    if parts:
        need = pools + n * offload + (cpu_platform.kv_cache_space_gib(spec) * GiB
                                      if cpu_platform.is_cpu(spec) else 0)
        out.append(Requirement("host-memory", need, " and ".join(parts),
                               f"lower {' or '.join(fields)}, or use nodes with more memory "
                               "(vLLM checks the host's RAM, not the pod's memory limit)"))
    return out
