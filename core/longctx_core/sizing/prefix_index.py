"""Sizing of the endpoint picker's approximate prefix index, from the capacity plan (pure).

llm-d's `approx-prefix-cache-producer` remembers, per server (one endpoint the picker
scores = one engine data-parallel rank), an LRU of hashed prefix blocks of `blockSize`
tokens. If that LRU is smaller than what the rank really keeps, the picker forgets prefixes
the rank still holds and routes their follow-ups elsewhere; a larger LRU only costs picker
memory. So the default is what the largest rank can hold, across its tiers:

    tokens per rank = GPU KV tokens + CPU offload tokens     (no HiSparse)
                    = HiSparse host pool tokens              (HiSparse decode)
    GPU KV tokens   = KV budget per GPU x PP // KV bytes per token x DCP
                      (PP splits the layers, so a GPU holds 1/PP of a token; DCP shards
                      tokens across DCP GPUs; TP and PCP replicate, adding nothing)
    CPU offload     = the plan's cpuOffloadTokensPerRank (whole tokens of one rank)
    HiSparse host   = (host pool pages - spare pages) x 64. A HiSparse decode rank keeps
                      a token's MLA rows only in its host pool; its GPU (indexer keys and a
                      hot buffer) and its CPU offload (indexer group only) hold other parts
                      of the same tokens, so they add no reusable token.

    lruCapacityPerServer   = ceil(max over roles of tokens per rank / blockSize)
    maxPrefixTokensToMatch = maxContextTokens (the longest prefix worth matching is one
                             whole context; hashing less hides most of a 1M-token prefix)

The picker has one LRU size for every server, hence the max over prefill and decode. The
sum is an upper bound (the CPU tier may copy GPU blocks): erring high is the cheap side.
Explicit spec.router.prefixCache values win. Docs: docs/router.md#prefix-index-sizing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.memory import (BLOCK_TOKENS, HISPARSE_SPARE_PAGES, hisparse_enabled,
                     hisparse_page_bytes)
from longctx_core.sizing.planner import CapacityPlan, RoleCapacity, plan as capacity_plan


@dataclass(frozen=True)
class RankTokens:
    """Tokens one engine rank of a role holds, per tier."""

    role: str
    gpu: int
    cpu_offload: int
    hisparse_host: int

    @property
    def total(self) -> int:
        return self.gpu + self.cpu_offload + self.hisparse_host


def gpu_tokens_per_rank(cap: RoleCapacity, bytes_per_token: int) -> int:
    """Whole tokens in one rank's GPU KV (0 when the budget is unknown or negative)."""
    kv = cap.budget.kv
    if kv is None or kv <= 0 or bytes_per_token <= 0:
        return 0
    layout = cap.layout
    return kv * layout.pipelineParallel // bytes_per_token * layout.decodeContextParallel


def hisparse_host_tokens_per_rank(spec: LongContextDeploymentSpec, plan: CapacityPlan) -> int:
    """Tokens of MLA rows one decode rank's HiSparse host pool holds (its spare pages hold
    none)."""
    if not hisparse_enabled(spec, "decode"):
        return 0
    pages = plan.decode.hisparse_pool_bytes // hisparse_page_bytes(plan.architecture,
                                                                   plan.kv_cache_dtype)
    return max(pages - HISPARSE_SPARE_PAGES, 0) * BLOCK_TOKENS


def rank_tokens(spec: LongContextDeploymentSpec, plan: CapacityPlan) -> list[RankTokens]:
    """Per role, the tokens one of its ranks holds in each tier (see the module docstring)."""
    out = []
    for cap in (plan.prefill, plan.decode):
        if hisparse_enabled(spec, cap.role):
            out.append(RankTokens(cap.role, 0, 0, hisparse_host_tokens_per_rank(spec, plan)))
        else:
            out.append(RankTokens(cap.role, gpu_tokens_per_rank(cap, plan.bytes_per_token.total),
                                  cap.cpu_offload_tokens_per_rank, 0))
    return out


def derived_lru_capacity(spec: LongContextDeploymentSpec,
                         plan: Optional[CapacityPlan] = None) -> int:
    """ceil(max over roles of tokens per rank / blockSize), at least 1 (the API minimum)."""
    plan = plan or capacity_plan(spec)
    tokens = max(r.total for r in rank_tokens(spec, plan))
    return max(-(-tokens // spec.router.prefixCache.blockSize), 1)


@dataclass(frozen=True)
class PrefixIndex:
    """The producer's sizing parameters as the picker config carries them."""

    blockSize: int
    maxPrefixTokensToMatch: int
    lruCapacityPerServer: int


def prefix_index(spec: LongContextDeploymentSpec,
                 plan: Optional[CapacityPlan] = None) -> PrefixIndex:
    """The explicit spec.router.prefixCache values, else the ones derived from the plan."""
    prefix = spec.router.prefixCache
    lru = prefix.lruCapacityPerServer
    if lru is None:
        lru = derived_lru_capacity(spec, plan)
    longest = prefix.maxPrefixTokensToMatch
    if longest is None:
        longest = spec.maxContextTokens
    return PrefixIndex(prefix.blockSize, longest, lru)
