"""The parallel layout of one role, and the ports one pod of it serves (pure).

Vocabulary:
- rank: one vLLM engine (one data-parallel rank) of TP x PP x PCP GPUs;
- ranks per pod: gpusPerPod / (TP x PP x PCP);
- group: the pods that together form one engine with `dataParallel` ranks
  (dataParallel / ranks-per-pod pods; usually 1). Pods of a StatefulSet are grouped by
  ordinal: group k holds ordinals k*P .. k*P+P-1, and its lowest ordinal is the
  data-parallel master.

Data-parallel modes:
- none: dataParallel == 1 (the target prefill: one PCP engine on the whole pod);
- multi-port: >= 2 ranks per pod; vLLM's supervisor starts one API server per rank on
  port base+i and serves aggregated /health, /ready on base+ranks
  (`--data-parallel-multi-port-external-lb`);
- external: one rank per pod and dataParallel > 1 (`--data-parallel-rank`).

A Layout is built from any spec, valid or not; the validation rules (rules.py) refuse
the ones whose numbers do not divide.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from longctx_core import contract
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.scaling import role_replicas


@dataclass(frozen=True)
class Layout:
    """The parallel layout of one role (field names are the spec's)."""

    role: str = "prefill"
    replicas: int = 1
    gpusPerPod: int = 8
    tensorParallel: int = 1
    pipelineParallel: int = 1
    prefillContextParallel: int = 1
    decodeContextParallel: int = 1
    dataParallel: int = 1
    expertParallel: bool = True

    @property
    def gpus_per_rank(self) -> int:
        """GPUs of one engine (data-parallel) rank: TP x PP x PCP."""
        return self.tensorParallel * self.pipelineParallel * self.prefillContextParallel

    @property
    def ranks_per_pod(self) -> int:
        return max(self.gpusPerPod // self.gpus_per_rank, 1)

    @property
    def pods_per_group(self) -> int:
        """Pods that form one data-parallel engine."""
        return max(self.dataParallel // self.ranks_per_pod, 1)

    @property
    def ranks(self) -> int:
        """Data-parallel engine ranks over all pods of the role."""
        return max(self.replicas * self.gpusPerPod // self.gpus_per_rank, 0)

    @property
    def dp_mode(self) -> str:
        if self.dataParallel == 1:
            return "none"
        return "multi-port" if self.ranks_per_pod >= 2 else "external"

    @property
    def expert_split(self) -> int:
        """GPUs that split the routed experts of one layer: the whole engine's DP x TP x PCP
        under expert parallelism, else TP (tensor-parallel MoE)."""
        if self.expertParallel:
            return self.dataParallel * self.tensorParallel * self.prefillContextParallel
        return self.tensorParallel

    def with_dcp(self, dcp: int) -> "Layout":
        return dataclasses.replace(self, decodeContextParallel=dcp)

    def describe(self) -> str:
        parts = []
        if self.prefillContextParallel > 1:
            parts.append(f"PCP{self.prefillContextParallel}")
        if self.decodeContextParallel > 1:
            parts.append(f"DCP{self.decodeContextParallel}")
        if self.tensorParallel > 1:
            parts.append(f"TP{self.tensorParallel}")
        if self.pipelineParallel > 1:
            parts.append(f"PP{self.pipelineParallel}")
        if self.dataParallel > 1 or not parts:
            parts.append(f"DP{self.dataParallel}")
        text = " x ".join(parts)
        if self.expertParallel:
            text += f" x EP{self.expert_split}"
        return f"{text}; {self.replicas} pod(s) x {self.gpusPerPod} GPUs"


def role_layout(spec: LongContextDeploymentSpec, role: str) -> Layout:
    r = getattr(spec, role)
    return Layout(role, role_replicas(spec, role), r.gpusPerPod, r.tensorParallel, r.pipelineParallel,
                  r.contextParallel.prefill, r.contextParallel.decode, r.dataParallel,
                  r.expertParallel)


def role_layouts(spec: LongContextDeploymentSpec) -> tuple[Layout, Layout]:
    return role_layout(spec, "prefill"), role_layout(spec, "decode")


@dataclass(frozen=True)
class EnginePorts:
    """Container ports of one engine pod."""

    http: list[int]                 # vLLM OpenAI servers: one per local rank
    supervisor: Optional[int]       # multi-port DP supervisor (/health, /ready, /readyz)
    nixl: list[int]                 # NIXL side channel per local rank
    serving: list[int]              # where the pool reaches rank i (decode: the sidecar)

    @property
    def health(self) -> int:
        """The port whose /health covers every rank of the pod."""
        return self.supervisor if self.supervisor is not None else self.http[0]

    @property
    def ready_path(self) -> str:
        return "/readyz" if self.supervisor is not None else "/health"


def engine_ports(layout: Layout, side_channel_port: int, decode_sidecar: bool = True
                 ) -> EnginePorts:
    """`decode_sidecar`: llm-d's routing sidecar takes the decode pod's serving ports and
    forwards to the engine's; vllm-router reaches every engine on the serving ports."""
    base = contract.ENGINE_BASE_PORTS[layout.role] if decode_sidecar \
        else contract.SERVING_BASE_PORT
    n = layout.ranks_per_pod
    multi = layout.dp_mode == "multi-port"
    return EnginePorts(
        http=[base + i for i in range(n)] if multi else [base],
        supervisor=base + n if multi else None,
        nixl=[side_channel_port + i for i in range(n)],
        serving=[contract.SERVING_BASE_PORT + i for i in range(n)])
