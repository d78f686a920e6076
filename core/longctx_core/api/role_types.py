"""spec.prefill and spec.decode: each role's pods, GPUs and parallel layout, and decode's
HiSparse host KV pool. RANK_GPUS, RANKS_PER_POD and DIVIDES are CEL over a role object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx_core.api.fields import power_of_two
from longctx_core.api.schema import APIObject, Quantity, Rule, SizeOrAuto, api_field


@dataclass(frozen=True, kw_only=True)
class ContextParallel(APIObject):
    """Context parallelism: PCP splits the prompt's tokens, DCP shards the KV cache by token."""

    CEL = (
        power_of_two("prefill"), power_of_two("decode"),
        Rule("self.prefill == 1 || self.decode == 1 || self.commBackend == 'ag_rs'",
             "commBackend is {self.commBackend} with prefill {self.prefill} and decode "
             "{self.decode}: vLLM's Model Runner V2 rejects a2a when both context "
             "parallelisms are above 1; set commBackend to ag_rs"),
        Rule("self.prefill == 1 || self.decode == 1 || self.decode == self.prefill",
             "decode ({self.decode}) must equal prefill ({self.prefill}) when both are above "
             "1: NIXL re-assembles the KV shards one-to-one; set decode to {self.prefill}"),
    )
    prefill: int = api_field("Prefill context parallelism (PCP, --prefill-context-parallel-size).",
                             1, minimum=1, maximum=64)
    decode: int = api_field("Decode context parallelism (DCP, --decode-context-parallel-size).", 1,
                            minimum=1, maximum=64)
    commBackend: str = api_field("DCP communication backend (--dcp-comm-backend).", "ag_rs",
                                 enum=("ag_rs", "a2a"))


RANK_GPUS = "(self.tensorParallel * self.pipelineParallel * self.contextParallel.prefill)"
RANKS_PER_POD = f"(self.gpusPerPod / {RANK_GPUS})"
DIVIDES = f"({RANK_GPUS} <= self.gpusPerPod && self.gpusPerPod % {RANK_GPUS} == 0)"


def _role_rules() -> tuple[Rule, ...]:
    """Rules every role obeys (the ranks of a pod, the groups of pods, the DCP size)."""
    return (
        power_of_two("gpusPerPod"), power_of_two("dataParallel"),
        power_of_two("tensorParallel"),
        Rule(DIVIDES,
             "one engine rank takes tensorParallel x pipelineParallel x "
             "contextParallel.prefill = {self.tensorParallel} x {self.pipelineParallel} x "
             "{self.contextParallel.prefill} GPUs, which must divide gpusPerPod "
             "({self.gpusPerPod}); change gpusPerPod or the parallel sizes"),
        Rule(f"!{DIVIDES} || self.dataParallel % {RANKS_PER_POD} == 0",
             "dataParallel ({self.dataParallel}) must be a multiple of the ranks one pod "
             "holds (gpusPerPod / (tensorParallel x pipelineParallel x "
             "contextParallel.prefill)), so that every GPU of every pod serves"),
        Rule(f"!has(self.replicas) || !{DIVIDES} || self.dataParallel < {RANKS_PER_POD} || "
             f"self.replicas % (self.dataParallel / {RANKS_PER_POD}) == 0",
             "replicas ({self.replicas}) must be a multiple of the pods of one data-parallel "
             "group (dataParallel {self.dataParallel} / the ranks one pod holds)"),
        # The NIXL transfer parallel size is max(TP, PCP); DCP is 1 or exactly that.
        Rule("self.contextParallel.decode == 1 || "
             "(self.tensorParallel >= self.contextParallel.prefill && "
             "self.contextParallel.decode == self.tensorParallel) || "
             "(self.contextParallel.prefill >= self.tensorParallel && "
             "self.contextParallel.decode == self.contextParallel.prefill)",
             "contextParallel.decode is {self.contextParallel.decode}; it must be 1 or "
             "max(tensorParallel, contextParallel.prefill) = max({self.tensorParallel}, "
             "{self.contextParallel.prefill}), the NIXL transfer parallel size"),
    )


@dataclass(frozen=True, kw_only=True)
class HiSparse(APIObject):
    """Hybrid HiSparse: KV resident in pinned host memory, a GPU hot buffer of top-k rows."""

    enabled: bool = api_field("Use HiSparse on decode. false gives the offload-only baseline.", True)
    hostPoolPerRank: SizeOrAuto = api_field(
        "Pinned host KV pool per data-parallel rank (host_pool_gib). auto: the least pool that "
        "holds requestsPerRank requests of maxContextTokens by vLLM's rule (each request "
        "cdiv(maxContextTokens, 64) pages of 64 tokens of MLA KV, plus 2 spare pages).",
        SizeOrAuto("auto"))
    requestsPerRank: int = api_field(
        "Requests of maxContextTokens one rank's host pool holds when hostPoolPerRank is auto.",
        1, minimum=1, maximum=1024)
    deviceBufferSize: Optional[int] = api_field(
        "GPU hot-buffer rows per request (hisparse_config.device_buffer_size); vLLM infers it "
        "when unset.", None, minimum=1)


_COMMON_ROLE_DOCS = {
    "replicas": "Pods (one per node). Each pod takes gpusPerPod GPUs. Used only while "
                "spec.replicas is unset (default: one unit's share, "
                "spec.scaling.<role>PerUnit); leave it unset to scale in P/D units.",
    "gpusPerPod": "GPUs per pod (nvidia.com/gpu).",
}


@dataclass(frozen=True, kw_only=True)
class Prefill(APIObject):
    """The prefill role: long prompts, KV produced for decode over NIXL."""

    CEL = _role_rules()
    replicas: Optional[int] = api_field(_COMMON_ROLE_DOCS["replicas"], None, minimum=0,
                                        maximum=64)
    gpusPerPod: int = api_field(_COMMON_ROLE_DOCS["gpusPerPod"], 8, minimum=1, maximum=64)
    tensorParallel: int = api_field("Tensor parallelism. Must be 1 with context parallelism.", 1,
                                    minimum=1, rules=(Rule("self == 1", "tensorParallel is "
                                                           "{self}; it must be 1: context "
                                                           "parallelism replaces it for long "
                                                           "prompts"),))
    pipelineParallel: int = api_field("Pipeline parallelism.", 1, minimum=1, maximum=8)
    dataParallel: int = api_field("Data-parallel ranks (the DP8 baseline sets 8 and PCP 1).", 1,
                                  minimum=1, maximum=512)
    contextParallel: ContextParallel = api_field(
        "Context parallelism.", ContextParallel(prefill=8, decode=8, commBackend="ag_rs"))
    expertParallel: bool = api_field("Expert parallelism for MoE layers.", True)
    cpuOffloadPerRank: Quantity = api_field(
        "CPU KV offload per engine rank for prefix reuse (OffloadingConnector cpu_bytes_to_use); "
        "backed by /dev/shm. 0 disables.", Quantity("512Gi"))


@dataclass(frozen=True, kw_only=True)
class Decode(APIObject):
    """The decode role: data-parallel ranks that receive KV over NIXL and stream tokens."""

    CEL = _role_rules() + (
        Rule("self.contextParallel.prefill == 1",
             "contextParallel.prefill is {self.contextParallel.prefill}; it must be 1: NIXL "
             "supports prefill context parallelism only on the producer (prefill) side"),
        Rule("!self.hiSparse.enabled || self.contextParallel.decode == 1",
             "HiSparse cannot run with decode context parallelism "
             "({self.contextParallel.decode}): set contextParallel.decode to 1 or "
             "hiSparse.enabled to false"),
        Rule("!self.hiSparse.enabled || self.pipelineParallel == 1",
             "HiSparse cannot run with pipeline parallelism ({self.pipelineParallel}): set "
             "pipelineParallel to 1 or hiSparse.enabled to false"),
    )
    replicas: Optional[int] = api_field(_COMMON_ROLE_DOCS["replicas"], None, minimum=0,
                                        maximum=64)
    gpusPerPod: int = api_field(_COMMON_ROLE_DOCS["gpusPerPod"], 8, minimum=1, maximum=64)
    tensorParallel: int = api_field("Tensor parallelism per data-parallel rank.", 1, minimum=1)
    pipelineParallel: int = api_field("Pipeline parallelism.", 1, minimum=1, maximum=8)
    dataParallel: int = api_field(
        "Data-parallel ranks of one engine group; a group larger than gpusPerPod spans several "
        "pods (start rank from the pod ordinal).", 8, minimum=1, maximum=512)
    contextParallel: ContextParallel = api_field("Context parallelism (DCP only on decode).",
                                                 ContextParallel())
    expertParallel: bool = api_field("Expert parallelism for MoE layers.", True)
    hiSparse: HiSparse = api_field("Hybrid HiSparse.", HiSparse())
    cpuOffloadPerRank: Quantity = api_field(
        "CPU KV offload per data-parallel rank (OffloadingConnector cpu_bytes_to_use).",
        Quantity("16Gi"))
