"""Nodes as the planner sees them (Node objects parsed into labels and allocatable memory), and
the check of each role's pod memory and the spec's GPU quantities against them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from longctx_core.sizing import models, placement
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.kv_sizing import hisparse_host_requests
from longctx_core.sizing.layout import role_layout
from longctx_core.sizing.memory import hisparse_enabled, pod_memory
from longctx_core.quantity import AUTO, GiB, MiB, gib, parse_bytes

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


def _host_memory_fix(spec: LongContextDeploymentSpec, role: str, need: int,
                     allocatable: int, pool: int) -> tuple[str, str]:
    """The spec field that holds most of one pod's host memory (with its value), and the
    change of it that makes the pod fit `allocatable`."""
    r = getattr(spec, role)
    fields = [(parse_bytes(r.cpuOffloadPerRank), f"spec.{role}.cpuOffloadPerRank",
               r.cpuOffloadPerRank)]
    hs = spec.decode.hiSparse
    if hisparse_enabled(spec, role):
        fields.append((pool, "spec.decode.hiSparse.hostPoolPerRank",
                       f"{hs.hostPoolPerRank} = {gib(pool)} GiB" if hs.hostPoolPerRank == AUTO
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


def host_memory(spec: LongContextDeploymentSpec, nodes: Optional[list[NodeMemory]],
                hisparse_pool: int) -> tuple[dict[str, Any], Optional[str], Optional[str]]:
    """Each role's pod memory (CPU offload in /dev/shm, HiSparse pinned pools, process RSS
    and page-cache headroom: memory.pod_memory) and one GPU's memory against the nodes the
    placement selects. Returns (the plan's hostMemory object, a refusal, a note); `nodes`
    None means no node list (offline, or no permission to list nodes): nothing is checked."""
    pods = {role: pod_memory(spec, role_layout(spec, role), hisparse_pool).request
            for role in ("prefill", "decode")}
    out: dict[str, Any] = {f"{role}PodGiB": gib(need) for role, need in pods.items()}
    if nodes is None:
        out["checked"] = False
        return out, None, ("host memory per pod was not checked against the nodes (no node "
                           "list: offline, or the operator may not list nodes)")
    selected = placement.selected(spec.placement, nodes)
    out.update(checked=bool(selected), nodes=len(selected))
    if not selected:
        return out, None, (f"no node matches the placement ({placement.describe(spec.placement)}); host "
                           "memory per pod was not checked")
    largest = max(selected, key=lambda n: n.allocatable)
    out["largestAllocatableGiB"] = gib(largest.allocatable)
    problems = []
    for role, need in pods.items():
        if need > largest.allocatable:
            field, change = _host_memory_fix(spec, role, need, largest.allocatable,
                                             hisparse_pool)
            problems.append(
                f"{field} makes each {role} pod need {gib(need)} GiB "
                f"of host memory (CPU offload, HiSparse pools, /dev/shm and process memory), "
                f"but the largest node the placement selects ({largest.name}, "
                f"{placement.describe(spec.placement)}) has {gib(largest.allocatable)} GiB allocatable: "
                f"{change}")
    gpu_sizes = [n.gpu_memory for n in selected if n.gpu_memory is not None]
    gpu = parse_bytes(spec.capacity.gpuMemory, "spec.capacity.gpuMemory")
    if gpu_sizes and gpu > max(gpu_sizes):
        problems.append(
            f"spec.capacity.gpuMemory ({spec.capacity.gpuMemory}, {gib(gpu)} GiB) is more than "
            f"the largest GPU of the selected nodes ({gib(max(gpu_sizes))} GiB, label "
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
