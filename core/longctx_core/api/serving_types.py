"""How requests reach the engines and KV moves between them: spec.disaggregation, the prefix
cache, spec.router and spec.kvTransfer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx_core.api.fields import MAX_IMAGE_LENGTH, image_rule
from longctx_core.contract import NIXL_SIDE_CHANNEL_PORT
from longctx_core.api.schema import APIObject, Preserved, api_field


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

    decider: str = api_field(
        "auto: prefix-based, at the threshold the plan's performance model derives for the "
        "layout (`longctx plan` shows it and why; docs/performance.md#disaggregation-threshold); "
        "always: every request is prefilled remotely; prefix-based: only when at least "
        "nonCachedTokens tokens are not cached on the decode pod.", "auto",
        enum=("auto", "always", "prefix-based"))
    nonCachedTokens: int = api_field("prefix-based: prefill remotely from this many uncached "
                                     "tokens (0: never).", 16, minimum=0)
    promptTokens: int = api_field("prefix-based: only prompts at least this long (0: any).", 0,
                                  minimum=0)


@dataclass(frozen=True, kw_only=True)
class GatewayRef(APIObject):
    """A Gateway API Gateway to attach an HTTPRoute to."""

    name: str = api_field("Gateway name.")
    namespace: Optional[str] = api_field("Gateway namespace (default: the CR's).", None)


@dataclass(frozen=True, kw_only=True)
class RouterPlacement(APIObject):
    """Where the router's pods run (vllm-router, or llm-d's endpoint picker)."""

    nodeSelector: dict[str, str] = api_field("Node labels to require.", {})
    tolerations: list[Preserved] = api_field("Tolerations (core/v1 Toleration).", [])


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
    sessionAffinity: str = api_field(
        "How vllm-router keeps a conversation on the prefill pod that holds its prefix. "
        "prefix: cache_aware, which in P/D mode matches token ids that vllm-router 0.1.17 "
        "cannot get from the engines, so each request goes to the pod with the fewest "
        "requests in flight: sessions arriving one at a time share a pod, and a later turn "
        "of sessions in flight together can land away from its prefix. sessionId: by the "
        "session each client names (the X-Session-ID header or the OpenAI user field; "
        "sticky_least_loaded): a new session goes to the pod holding the fewest, and a "
        "request that names none is balanced alone and reuses no prefix. "
        "llm-d's picker spreads sessions by prefix itself: keep prefix there.",
        "prefix", enum=("prefix", "sessionId"))
    prefixCache: PrefixCache = api_field("Prefix-cache scoring.", PrefixCache())
    disaggregation: Disaggregation = api_field("P/D decider.", Disaggregation())
    gateway: Optional[GatewayRef] = api_field("Attach an HTTPRoute to this Gateway.", None)
    placement: Optional[RouterPlacement] = api_field(
        "Where the router's pods run; unset: on the nodes spec.placement selects for the "
        "engines (its nodeSelector and tolerations; no GPU is requested).", None)

    @property
    def decode_sidecar(self) -> bool:
        """Whether a routing sidecar fronts decode's serving ports (llm-d's); the operator's
        Router of each type builds the rest (longctx_operator/controller/routers.py)."""
        return self.type == "llm-d"


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


# The operator's own image (Dockerfile target `operator`, the chart's appVersion): the
# endpoint runs from it (`longctx-endpoint`).
OPERATOR_IMAGE = "ghcr.io/longctx/longctx-operator:0.1.0"


@dataclass(frozen=True, kw_only=True)
class Continuation(APIObject):
    """How hard the endpoint tries to finish an answer whose upstream broke."""

    maxAttempts: int = api_field(
        "Continuations of one answer before it is given up (each re-sends the prompt and "
        "the tokens generated so far).", 3, minimum=1, maximum=20)
    giveUpSeconds: Optional[int] = api_field(
        "From a break to giving up, unless a continuation delivers a token first (unset: "
        "the plan's request timeout, which holds a queued max-context prefill, its KV "
        "transfer and the answer).", None, minimum=1, maximum=86400)


@dataclass(frozen=True, kw_only=True)
class Endpoint(APIObject):
    """The client-facing, OpenAI-compatible endpoint in front of the router: it continues
    an answer on another decode (or on prefill alone while no decode is Ready) when its
    stream breaks (docs/data-path.md#the-endpoint)."""

    enabled: bool = api_field(
        "Deploy the endpoint (<name>-endpoint; status.endpoint is its URL). It needs "
        "a router: vllm-router, or llm-d with router.gateway.", True)
    replicas: int = api_field("Endpoint pods behind its Service; two or more, so that none "
                              "is a single point of failure.", 2, minimum=2, maximum=64)
    image: str = api_field(
        "Image holding `longctx-endpoint` (the operator's).", OPERATOR_IMAGE,
        max_length=MAX_IMAGE_LENGTH, rules=(image_rule("endpoint.image", OPERATOR_IMAGE),))
    routerURL: Optional[str] = api_field(
        "With router type llm-d: the address of the Gateway in front of the InferencePool "
        "(default http://<router.gateway.name>.<its namespace>.svc:80). vllm-router's "
        "pods are found by label.", None, max_length=512, pattern="^https?://[^ ]+$")
    continuation: Continuation = api_field("Continued answers.", Continuation())
    drainSeconds: Optional[int] = api_field(
        "How long a leaving endpoint pod (a rollout, a node drain) keeps finishing its "
        "answers in flight (unset: the plan's request timeout).", None, minimum=0,
        maximum=86400)
