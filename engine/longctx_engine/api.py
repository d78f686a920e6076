"""The LongContextDeployment API (longctx.dev/v1alpha1): the single source of truth.

`crds/` and the chart's CRD are generated from these classes
(`longctx crd`), and the operator, planner and engine recipes read specs
through `load_spec`, so defaults and field names cannot drift between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .contract import (GROUP, KIND, MAX_CR_NAME_LENGTH, MAX_POOL_TARGET_PORTS,
                       NIXL_SIDE_CHANNEL_PORT, PLURAL, VERSION)
from .schema import APIObject, Preserved, Quantity, Rule, SizeOrAuto, api_field, dump, load

SINGULAR = "longcontextdeployment"
SHORT_NAMES = ("lcd",)

MAX_NAME_LENGTH = MAX_CR_NAME_LENGTH

# MTP draft layers of each preset (models.PRESETS reads them from here), so that the
# CEL rules about MTP can tell a preset's layers without the planner.
PRESET_MTP_LAYERS = {"glm-5.3": 1, "deepseek-v3.2": 1}
PRESET_NAMES = tuple(PRESET_MTP_LAYERS)
_PRESET_MTP_MAP = "{" + ", ".join(f"'{k}': {v}" for k, v in PRESET_MTP_LAYERS.items()) + "}"
NAME_RULE = Rule(f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                 f"metadata.name {{self.metadata.name}} is longer than {MAX_NAME_LENGTH} "
                 "characters; the StatefulSet names derived from it (<name>-prefill-<revision> "
                 "plus the controller's hash) must stay within Kubernetes' 63-character "
                 "limit: choose a shorter name")


# A container image reference (registry/repository[:tag][@digest], the grammar of
# distribution/reference), written without backslashes so that CEL (RE2) and the offline
# check read the same pattern; the kubelet reports anything else as InvalidImageName only
# after the old pod is gone.
_HOST_PART = "[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_PATH_PART = "[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
IMAGE_PATTERN = (f"^(?:{_HOST_PART}(?:[.]{_HOST_PART})*(?::[0-9]+)?/)?{_PATH_PART}"
                 f"(?:/{_PATH_PART})*(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{{0,127}})?"
                 "(?:@[a-zA-Z][a-zA-Z0-9]*(?:[-_+.][a-zA-Z][a-zA-Z0-9]*)*:[a-fA-F0-9]{32,})?$")
MAX_IMAGE_LENGTH = 512


def image_rule(field: str, example: str) -> Rule:
    return Rule(f"self.matches('{IMAGE_PATTERN}')",
                f"{field} is not an image reference "
                "(registry/repository[:tag][@sha256:digest], lowercase repository, no spaces); "
                f"write it like {example}")


# A --model or --served-model-name value: one argv word that vLLM cannot read as a flag
# (no leading '-', no spaces or control characters).
ARGV_NAME_PATTERN = "^[A-Za-z0-9_./~][-A-Za-z0-9_./:@+~=]*$"


def argv_name_rule(field: str, flag: str) -> Rule:
    return Rule(f"self.matches('{ARGV_NAME_PATTERN}')",
                f"{field} is not one {flag} word: write a Hugging Face repo id "
                "(org/name) or a path, without spaces, control characters or a leading '-' "
                "(vLLM would read it as a flag)")


def power_of_two(field: str) -> Rule:
    """The integer field is 1, 2, 4, ... 512 (GPU counts of one node group)."""
    return Rule(f"self.{field} in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]",
                f"{field} is {{self.{field}}}; it must be a power of two (1, 2, 4, ... 512)")


@dataclass(frozen=True, kw_only=True)
class Architecture(APIObject):
    """Model architecture numbers the capacity planner needs (a preset is the same object, named)."""

    layers: int = api_field("Attention (MLA) layers of the main model.", minimum=1)
    mtpLayers: int = api_field("MTP draft layers; each carries MLA KV and indexer keys.", 0, minimum=0)
    attentionHeads: int = api_field("Query heads per attention layer.", minimum=1)
    kvLoraRank: int = api_field("MLA latent (compressed KV) dimension, e.g. 512.", minimum=1)
    qkRopeHeadDim: int = api_field("Decoupled RoPE key dimension, e.g. 64.", minimum=0)
    indexLayers: int = api_field("Layers with a sparse-attention indexer (DSA); 0 for dense MLA.", 0,
                                 minimum=0)
    indexHeads: int = api_field("Indexer query heads.", 0, minimum=0)
    indexHeadDim: int = api_field("Indexer key dimension.", 0, minimum=0)
    indexTopK: int = api_field("Keys each query attends to under sparse attention (top-k).", 0,
                               minimum=0)
    parameterBytes: Optional[Quantity] = api_field(
        "Bytes of all weights as served (e.g. FP8); the planner subtracts each GPU's share "
        "from its memory to estimate the KV budget. Without it, set "
        "spec.capacity.kvBudgetPerGpu.", None)
    replicatedParameterBytes: Optional[Quantity] = api_field(
        "Bytes of the weights that expert parallelism does not split (attention and indexer "
        "projections, dense and shared-expert MLPs, embeddings, LM head): every GPU holds "
        "them, divided only by tensorParallel. The rest of parameterBytes is split across the "
        "expert-parallel group. Without it the planner divides all of parameterBytes by the "
        "expert-parallel group, which overestimates the KV budget.", None)


@dataclass(frozen=True, kw_only=True)
class SecretKeyRef(APIObject):
    """A key of a Secret in the CR's namespace."""

    name: str = api_field("Secret name.", max_length=253)
    key: str = api_field("Key inside the Secret.", "HF_TOKEN")


@dataclass(frozen=True, kw_only=True)
class PVCSource(APIObject):
    """Weights on a PersistentVolumeClaim (read-only)."""

    claimName: str = api_field("PersistentVolumeClaim name in the CR's namespace.", max_length=253)
    subPath: str = api_field("Directory inside the claim that holds the model.", "")


@dataclass(frozen=True, kw_only=True)
class HuggingFaceSource(APIObject):
    """Weights downloaded from Hugging Face at start-up."""

    tokenSecretRef: Optional[SecretKeyRef] = api_field(
        "Secret key with the Hugging Face token (for gated models).", None)


@dataclass(frozen=True, kw_only=True)
class ModelSource(APIObject):
    """Where the engine finds the weights: exactly one of pvc and huggingFace."""

    CEL = (Rule("has(self.pvc) != has(self.huggingFace)",
                "set exactly one of spec.model.source.pvc and spec.model.source.huggingFace"),)
    pvc: Optional[PVCSource] = api_field("Weights on a PVC mounted read-only at /models.", None)
    huggingFace: Optional[HuggingFaceSource] = api_field("Weights fetched from Hugging Face.", None)


@dataclass(frozen=True, kw_only=True)
class Model(APIObject):
    """The model served, identical on prefill and decode."""

    CEL = (Rule("has(self.preset) != has(self.architecture)",
                "set exactly one of spec.model.preset (glm-5.3, deepseek-v3.2) and "
                "spec.model.architecture"),)
    name: str = api_field(
        "The --model string (repo id or path). Prefill and decode use it verbatim.",
        max_length=253, rules=(argv_name_rule("name", "--model"),),
        immutable="the NIXL handshake hashes it; a change would pair prefill and decode pods "
                  "serving different models. Create a new LongContextDeployment instead.")
    servedName: Optional[str] = api_field(
        "Name clients use (--served-model-name).", None, max_length=253,
        rules=(argv_name_rule("servedName", "--served-model-name"),))
    preset: Optional[str] = api_field("A known architecture.", None, enum=PRESET_NAMES)
    architecture: Optional[Architecture] = api_field("Explicit architecture numbers.", None)
    source: ModelSource = api_field("Where the weights come from.")


@dataclass(frozen=True, kw_only=True)
class Speculative(APIObject):
    """Speculative decoding; prefill runs it too because NIXL compares it."""

    CEL = (Rule("self.method == 'none' || self.draftTokens >= 1",
                "draftTokens is {self.draftTokens}; it must be at least 1 when method is mtp "
                "(or set method to none)"),)
    method: str = api_field("mtp (multi-token prediction) or none.", "mtp", enum=("mtp", "none"),
                            immutable="the NIXL handshake compares it between prefill and decode.")
    draftTokens: int = api_field("Draft tokens per step (num_speculative_tokens).", 3,
                                 minimum=0, maximum=8)


@dataclass(frozen=True, kw_only=True)
class ExtraArgs(APIObject):
    """Extra `vllm serve` arguments, appended last. Flags the recipe manages are refused."""

    prefill: list[str] = api_field("Extra arguments for prefill engines.", [], max_items=64)
    decode: list[str] = api_field("Extra arguments for decode engines.", [], max_items=64)


@dataclass(frozen=True, kw_only=True)
class ThreadsBind(APIObject):
    """VLLM_CPU_OMP_THREADS_BIND of each role's engine: the cores its OpenMP threads pin."""

    prefill: str = api_field("Cores of the prefill engine (auto, or a list like 0-3).", "auto",
                             max_length=256)
    decode: str = api_field("Cores of the decode engine (auto, or a list like 4-7).", "auto",
                            max_length=256)


@dataclass(frozen=True, kw_only=True)
class CPUPlatform(APIObject):
    """vLLM's CPU backend: what a pod of each role gets on a CPU node."""

    kvCacheSpace: Quantity = api_field(
        "KV cache of each engine in host memory (VLLM_CPU_KVCACHE_SPACE; whole GiB).", "1Gi")
    coresPerPod: int = api_field("CPU cores each engine pod requests.", 4, minimum=1,
                                 maximum=512)
    threadsBind: ThreadsBind = api_field("Core pinning per role.", ThreadsBind())


@dataclass(frozen=True, kw_only=True)
class Engine(APIObject):
    """The vLLM engine image and settings shared by both roles."""

    platform: str = api_field(
        "gpu: H200 nodes, vLLM 0.33 with the context-parallel and HiSparse kernels. cpu: "
        "vLLM's CPU backend (vllm-cpu 0.32) on CPU nodes, one NixlConnector over UCX with "
        "DRAM buffers; for trying longctx and testing configurations without GPUs.", "gpu",
        enum=("gpu", "cpu"))
    cpu: CPUPlatform = api_field("Settings of the cpu platform.", CPUPlatform())

    image: str = api_field("Engine image (vLLM 0.33.0 plus longctx's engine and kernels).",
                           "ghcr.io/longctx/engine:0.1.0", max_length=MAX_IMAGE_LENGTH,
                           rules=(image_rule("image", "ghcr.io/longctx/engine:0.1.0"),))
    vllmVersion: str = api_field("vLLM version inside the image; must match across roles.",
                                 "0.33.0", pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")
    kvCacheDtype: str = api_field(
        "KV cache dtype. fp8 is canonicalised by vLLM to fp8_ds_mla for sparse MLA.", "fp8",
        enum=("fp8", "fp8_ds_mla", "auto"),
        immutable="prefill and decode must agree for the NIXL handshake; a rolling change "
                  "would pair old and new pods. Create a new LongContextDeployment instead.")
    speculative: Speculative = api_field("Speculative decoding.", Speculative())
    extraArgs: ExtraArgs = api_field("Extra engine arguments per role.", ExtraArgs())
    preflight: bool = api_field(
        "Run `longctx-kernels preflight` (HBM and PCIe bandwidth, an all-gather, a kernel's "
        "correctness, a NIXL transfer) before vLLM starts, so a bad node fails in seconds "
        "instead of after the model load.", False)
    engineReadyTimeoutSeconds: int = api_field(
        "VLLM_ENGINE_READY_TIMEOUT_S and the startup probe budget: loading a GLM-5-class "
        "model takes tens of minutes.", 3600, minimum=60)


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


_RANK_GPUS = "(self.tensorParallel * self.pipelineParallel * self.contextParallel.prefill)"
_RANKS_PER_POD = f"(self.gpusPerPod / {_RANK_GPUS})"
_DIVIDES = f"({_RANK_GPUS} <= self.gpusPerPod && self.gpusPerPod % {_RANK_GPUS} == 0)"


def _role_rules() -> tuple[Rule, ...]:
    """Rules every role obeys (the ranks of a pod, the groups of pods, the DCP size)."""
    return (
        power_of_two("gpusPerPod"), power_of_two("dataParallel"),
        power_of_two("tensorParallel"),
        Rule(_DIVIDES,
             "one engine rank takes tensorParallel x pipelineParallel x "
             "contextParallel.prefill = {self.tensorParallel} x {self.pipelineParallel} x "
             "{self.contextParallel.prefill} GPUs, which must divide gpusPerPod "
             "({self.gpusPerPod}); change gpusPerPod or the parallel sizes"),
        Rule(f"!{_DIVIDES} || self.dataParallel % {_RANKS_PER_POD} == 0",
             "dataParallel ({self.dataParallel}) must be a multiple of the ranks one pod "
             "holds (gpusPerPod / (tensorParallel x pipelineParallel x "
             "contextParallel.prefill)), so that every GPU of every pod serves"),
        Rule(f"!has(self.replicas) || !{_DIVIDES} || self.dataParallel < {_RANKS_PER_POD} || "
             f"self.replicas % (self.dataParallel / {_RANKS_PER_POD}) == 0",
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


@dataclass(frozen=True, kw_only=True)
class PrefixCache(APIObject):
    """Approximate prefix-cache routing in the endpoint picker."""

    blockSize: int = api_field("Tokens per hashed prefix block.", 64, minimum=1)
    maxPrefixTokensToMatch: Optional[int] = api_field(
        "Longest prefix the picker hashes (default: maxContextTokens, one whole context).",
        None, minimum=1)
    lruCapacityPerServer: Optional[int] = api_field(
        "Prefix blocks the picker remembers per server (default: derived from the capacity "
        "plan, the blocks the largest engine rank holds across GPU KV, CPU offload and "
        "HiSparse host pool; docs/router.md#prefix-index-sizing).", None, minimum=1)


@dataclass(frozen=True, kw_only=True)
class Disaggregation(APIObject):
    """When a request goes through prefill before decode."""

    decider: str = api_field("always: every request is prefilled remotely; prefix-based: only "
                             "when enough tokens are not cached on the decode pod.", "always",
                             enum=("always", "prefix-based"))
    nonCachedTokens: int = api_field("prefix-based: prefill remotely above this many uncached "
                                     "tokens.", 16, minimum=0)
    promptTokens: int = api_field("prefix-based: only prompts at least this long (0: any).", 0,
                                  minimum=0)


@dataclass(frozen=True, kw_only=True)
class GatewayRef(APIObject):
    """A Gateway API Gateway to attach an HTTPRoute to."""

    name: str = api_field("Gateway name.")
    namespace: Optional[str] = api_field("Gateway namespace (default: the CR's).", None)


@dataclass(frozen=True, kw_only=True)
class Router(APIObject):
    """The prefix-aware router in front of the engines: llm-d's (InferencePool, endpoint
    picker, decode routing sidecar) or vLLM's own (vllm-router)."""

    enabled: bool = api_field("Deploy the router objects.", True)
    type: str = api_field(
        "llm-d: an InferencePool, llm-d's endpoint picker and the decode routing sidecar. "
        "vllm-router: a Deployment and Service of vLLM's router, which discovers the serving "
        "revision's prefill and decode pods by label and drives the P/D legs itself.",
        "llm-d", enum=("llm-d", "vllm-router"))
    vllmRouterImage: str = api_field(
        "vllm-router image.", "ghcr.io/longctx/vllm-router:0.1.17",
        max_length=MAX_IMAGE_LENGTH, rules=(image_rule(
            "vllmRouterImage", "ghcr.io/longctx/vllm-router:0.1.17"),))
    pickerImage: str = api_field(
        "Endpoint picker image.", "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0",
        max_length=MAX_IMAGE_LENGTH, rules=(image_rule(
            "pickerImage", "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"),))
    sidecarImage: str = api_field(
        "Decode routing sidecar image.", "ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.10.0",
        max_length=MAX_IMAGE_LENGTH, rules=(image_rule(
            "sidecarImage", "ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.10.0"),))
    prefixCache: PrefixCache = api_field("Prefix-cache scoring.", PrefixCache())
    disaggregation: Disaggregation = api_field("P/D decider.", Disaggregation())
    gateway: Optional[GatewayRef] = api_field("Attach an HTTPRoute to this Gateway.", None)


@dataclass(frozen=True, kw_only=True)
class RDMA(APIObject):
    """An RDMA device resource requested by every engine pod."""

    resource: str = api_field("Extended resource name.", "rdma/ib")
    count: int = api_field("Devices per pod.", 1, minimum=1)


@dataclass(frozen=True, kw_only=True)
class KVTransfer(APIObject):
    """NIXL KV transfer from prefill to decode."""

    backend: str = api_field("NIXL backend.", "UCX", enum=("UCX", "LIBFABRIC"))
    sideChannelPort: int = api_field("Base NIXL side-channel port; rank i listens on base+i.",
                                     NIXL_SIDE_CHANNEL_PORT,
                                     minimum=1024, maximum=65000)
    rdma: Optional[RDMA] = api_field("RDMA resource; unset means TCP (slow, for tests).", None)


@dataclass(frozen=True, kw_only=True)
class Placement(APIObject):
    """Where engine pods run."""

    gpuProduct: str = api_field("Required value of the node label nvidia.com/gpu.product.",
                                "NVIDIA-H200", max_length=63)  # a label value
    nodeSelector: dict[str, str] = api_field("Extra node labels to require.", {})
    tolerations: list[Preserved] = api_field("Tolerations (core/v1 Toleration).", [])
    priorityClassName: Optional[str] = api_field("Pod priority class.", None, max_length=253)
    topologyKey: Optional[str] = api_field(
        "A node label naming a domain (a rack, an NVLink domain). Each decode pod is placed "
        "in the domain of its unit's prefill pod (the same pod index when prefillPerUnit "
        "equals decodePerUnit, else any prefill pod of this deployment), because a "
        "max-context request moves tens of GiB of KV from prefill to decode. The "
        "TopologySatisfiable condition says when no domain of the cluster's nodes can hold "
        "a unit.", None, max_length=317)


@dataclass(frozen=True, kw_only=True)
class Scaling(APIObject):
    """The P/D unit spec.replicas counts: the ratio of prefill to decode pods it keeps."""

    CEL = (Rule("self.prefillPerUnit >= 1 && self.decodePerUnit >= 1",
                "prefillPerUnit is {self.prefillPerUnit} and decodePerUnit is "
                "{self.decodePerUnit}; both must be at least 1: a unit needs a prefill and a "
                "decode pod to serve a request"),)
    prefillPerUnit: int = api_field("Prefill pods per unit.", 1, maximum=64)
    decodePerUnit: int = api_field("Decode pods per unit.", 1, maximum=64)


@dataclass(frozen=True, kw_only=True)
class AutoscalingMetrics(APIObject):
    """The signals the autoscaler keeps at their targets; the units follow the one that
    needs the most."""

    CEL = (Rule("self.decodeCapacityPercent > 0 || has(self.waitingRequestsPerUnit)",
                "decodeCapacityPercent is 0 and waitingRequestsPerUnit is unset: the "
                "autoscaler has no signal; set decodeCapacityPercent above 0 or "
                "waitingRequestsPerUnit"),)
    decodeCapacityPercent: int = api_field(
        "Share of the decode role's max-context request slots (the HiSparse host pool and "
        "the GPU hot buffer, from the capacity plan) that demand may fill before a unit is "
        "added. 0 turns this signal off.", 80, minimum=0, maximum=100)
    waitingRequestsPerUnit: Optional[int] = api_field(
        "Requests waiting in the engines' queues (prefill and decode) per unit before a "
        "unit is added (vLLM's vllm:num_requests_waiting).", None, minimum=1)


@dataclass(frozen=True, kw_only=True)
class Autoscaling(APIObject):
    """An autoscaler on the CR's /scale: a KEDA ScaledObject when KEDA's CRD is installed,
    else an autoscaling/v2 HorizontalPodAutoscaler on External metrics."""

    CEL = (Rule("self.minUnits <= self.maxUnits",
                "minUnits ({self.minUnits}) is more than maxUnits ({self.maxUnits}); raise "
                "maxUnits or lower minUnits"),)
    minUnits: int = api_field("Fewest units.", 1, minimum=1, maximum=64)
    maxUnits: int = api_field("Most units.", minimum=1, maximum=64)
    metrics: AutoscalingMetrics = api_field("What the units follow.", AutoscalingMetrics())
    scaleDownStabilizationSeconds: int = api_field(
        "How long the autoscaler waits on lower demand before it removes a unit (a removed "
        "unit drains its in-flight long requests first).", 300, minimum=0, maximum=3600)
    prometheusAddress: str = api_field(
        "Prometheus that KEDA queries for the signals (recorded by the deployment's "
        "PrometheusRule).", "http://prometheus-operated.monitoring.svc:9090", max_length=512)


@dataclass(frozen=True, kw_only=True)
class Rollout(APIObject):
    """How a new revision (a change of the NIXL pairing key: model, image, vLLM version, KV
    dtype, speculative method, pinned attention backend or block size) replaces the
    serving one. Other changes roll in place, one pod at a time, only on the role they
    touch."""

    strategy: str = api_field(
        "Surge: the new revision comes up beside the old one, the router switches to it at "
        "once when it is Ready, and the old one drains (needs the GPUs of a second "
        "revision). Recreate: the old revision stops, then the new one starts (no extra "
        "GPUs; no serving during the model load).", "Surge", enum=("Surge", "Recreate"))
    minReadyReplicas: Optional[int] = api_field(
        "Ready pods of each role the new revision needs before the router switches to it "
        "(default: all of each role's replicas).", None, minimum=1)
    drainSeconds: Optional[int] = api_field(
        "How long the old revision keeps its pods after the switch so that in-flight "
        "requests finish (default: the predicted time of the longest request at "
        "maxContextTokens).", None, minimum=0, maximum=86400)


@dataclass(frozen=True, kw_only=True)
class Monitoring(APIObject):
    """Prometheus scraping."""

    podMonitor: bool = api_field("Create PodMonitors when the monitoring.coreos.com CRD exists.",
                                 True)


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy(APIObject):
    """A NetworkPolicy for the engine pods: their serving ports open only to the endpoint
    picker and `clients`, the metrics ports to `scrapers`, and everything else (the NIXL
    side channel and transfer, data-parallel RPC, the decode sidecar's prefill leg) only
    between the prefill and decode pods of this CR."""

    enabled: bool = api_field("Create the NetworkPolicy (the cluster's CNI must enforce it).",
                              False)
    clients: list[Preserved] = api_field(
        "NetworkPolicyPeers (networking.k8s.io/v1) that may reach the serving ports: the "
        "Gateway's pods, or the clients when there is no Gateway.", [], max_items=16)
    scrapers: list[Preserved] = api_field(
        "NetworkPolicyPeers that may scrape the vLLM metrics ports (the PodMonitor's "
        "Prometheus).", [], max_items=16)


@dataclass(frozen=True, kw_only=True)
class Capacity(APIObject):
    """Inputs of the capacity planner."""

    kvBudgetPerGpu: Optional[Quantity] = api_field(
        "KV memory left per GPU after weights and activations; overrides the planner's "
        "estimate.", None)
    gpuMemory: Quantity = api_field(
        "Memory of one GPU as CUDA reports it (torch.cuda.mem_get_info total). The default "
        "is an H200's: 150109880320 bytes (139.8 GiB, measured). Used only to estimate the "
        "KV budget.", Quantity("150109880320"))
    gpuMemoryUtilizationPercent: int = api_field(
        "Share of gpuMemory vLLM may use, in percent (--gpu-memory-utilization x 100; vLLM's "
        "default 0.9). Set it to match any --gpu-memory-utilization in engine.extraArgs.", 90,
        minimum=1, maximum=100)
    activationReservePerGpu: Quantity = api_field(
        "Memory per GPU the planner sets aside for activations, CUDA graphs and communication "
        "buffers, on top of the sparse-MLA prefill workspace it derives from maxContextTokens.",
        Quantity("4Gi"))


@dataclass(frozen=True, kw_only=True)
class LongContextDeploymentSpec(APIObject):
    """A prefill/decode-disaggregated, long-context vLLM deployment on H200 nodes."""

    CEL = (
        Rule("self.engine.kvCacheDtype != 'auto' || "
             "(self.prefill.contextParallel.decode == 1 && self.decode.contextParallel.decode == 1)",
             "engine.kvCacheDtype is auto, a bf16 cache on H200, but decode context "
             "parallelism (prefill {self.prefill.contextParallel.decode}, decode "
             "{self.decode.contextParallel.decode}) needs fp8_ds_mla: set engine.kvCacheDtype "
             "to fp8"),
        Rule("self.engine.speculative.method != 'mtp' || "
             f"(has(self.model.preset) && {_PRESET_MTP_MAP}[self.model.preset] > 0) || "
             "(has(self.model.architecture) && self.model.architecture.mtpLayers > 0)",
             "engine.speculative.method is mtp but the model has no MTP layers "
             "(architecture.mtpLayers 0); set engine.speculative.method to none"),
        Rule("self.prefill.contextParallel.prefill == 1 || "
             "self.engine.speculative.method != 'mtp' || self.engine.speculative.draftTokens == 1 "
             f"|| (has(self.model.preset) && {_PRESET_MTP_MAP}[self.model.preset] <= 1) || "
             "(has(self.model.architecture) && self.model.architecture.mtpLayers <= 1)",
             "prefill context parallelism ({self.prefill.contextParallel.prefill}) runs only "
             "single-module MTP, but the model has several MTP layers and "
             "engine.speculative.draftTokens is {self.engine.speculative.draftTokens}; set "
             "engine.speculative.draftTokens to 1"),
        Rule("!has(self.rollout.minReadyReplicas) || has(self.replicas) || "
             "!has(self.prefill.replicas) || !has(self.decode.replicas) || "
             "(self.rollout.minReadyReplicas <= self.prefill.replicas && "
             "self.rollout.minReadyReplicas <= self.decode.replicas)",
             "rollout.minReadyReplicas ({self.rollout.minReadyReplicas}) is more than a role's "
             "replicas (prefill {self.prefill.replicas}, decode {self.decode.replicas}): the "
             "new revision could never be ready enough to switch to; lower it or leave it "
             "unset (all replicas)"),
        Rule("!self.router.enabled || (" + " && ".join(
            f"self.{role}.gpusPerPod <= {MAX_POOL_TARGET_PORTS} * "
            f"{_RANK_GPUS.replace('self.', f'self.{role}.')}" for role in ("prefill", "decode"))
             + ")",
             f"the router reaches every engine rank of a pod on its own port, and an "
             f"InferencePool lists at most {MAX_POOL_TARGET_PORTS}: with prefill.gpusPerPod "
             "{self.prefill.gpusPerPod} and decode.gpusPerPod {self.decode.gpusPerPod}, lower "
             "gpusPerPod or raise tensorParallel so that a pod holds at most "
             f"{MAX_POOL_TARGET_PORTS} ranks"),
        *(Rule(f"(has(self.{role}.replicas) && !has(self.replicas)) || "
               f"!{_DIVIDES.replace('self.', f'self.{role}.')} || "
               f"self.{role}.dataParallel < {_RANKS_PER_POD.replace('self.', f'self.{role}.')} || "
               f"self.scaling.{role}PerUnit % (self.{role}.dataParallel / "
               f"{_RANKS_PER_POD.replace('self.', f'self.{role}.')}) == 0",
               f"scaling.{role}PerUnit ({{self.scaling.{role}PerUnit}}) must be a multiple of "
               f"the pods of one {role} data-parallel group ({role}.dataParallel "
               f"{{self.{role}.dataParallel}} / the ranks one pod holds), so that every unit "
               "holds whole engines") for role in ("prefill", "decode")),
        Rule("!has(self.autoscaling) || (!has(self.prefill.replicas) && "
             "!has(self.decode.replicas))",
             "autoscaling is set beside explicit prefill.replicas or decode.replicas: the "
             "autoscaler scales spec.replicas in P/D units (scaling.prefillPerUnit and "
             "decodePerUnit pods each); remove prefill.replicas and decode.replicas"),
        Rule("!has(self.autoscaling) || has(self.replicas)",
             "autoscaling is set but replicas is not: the autoscaler reads and writes "
             "spec.replicas (P/D units) through /scale and does nothing while it is unset; "
             "set replicas to the units to start with, e.g. {self.autoscaling.minUnits}"),
    )

    model: Model = api_field("The model.")
    maxContextTokens: int = api_field("Longest context (prompt + output) served: --max-model-len. "
                                      "The planner proves the layout holds it.", minimum=1,
                                      maximum=16777216)
    engine: Engine = api_field("Engine settings shared by both roles.", Engine())
    prefill: Prefill = api_field("The prefill role.", Prefill())
    decode: Decode = api_field("The decode role.", Decode())
    router: Router = api_field("The llm-d router.", Router())
    kvTransfer: KVTransfer = api_field("NIXL KV transfer.", KVTransfer())
    placement: Placement = api_field("Placement of engine pods.", Placement())
    monitoring: Monitoring = api_field("Monitoring.", Monitoring())
    networkPolicy: NetworkPolicy = api_field("Network isolation of the engine pods.",
                                             NetworkPolicy())
    replicas: Optional[int] = api_field(
        "P/D units (the CR's /scale: `kubectl scale`, an HPA or KEDA write it). Each unit is "
        "scaling.prefillPerUnit prefill and scaling.decodePerUnit decode pods; while it is "
        "set, prefill.replicas and decode.replicas are ignored.", None, minimum=0, maximum=64)
    scaling: Scaling = api_field("The prefill:decode ratio of a unit.", Scaling())
    autoscaling: Optional[Autoscaling] = api_field(
        "Scale spec.replicas on the decode capacity signal and the waiting requests.", None)
    rollout: Rollout = api_field("How a new revision replaces the serving one.", Rollout())
    capacity: Capacity = api_field("Capacity planner inputs.", Capacity())


def load_spec(spec: dict[str, Any] | None) -> LongContextDeploymentSpec:
    """Typed spec from a manifest's `spec`, with the CRD's defaults; raises SpecError."""
    return load(LongContextDeploymentSpec, spec or {}, "spec")


def dump_spec(spec: LongContextDeploymentSpec) -> dict[str, Any]:
    return dump(spec)
