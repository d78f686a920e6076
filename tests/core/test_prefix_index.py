"""The picker's prefix index is sized from the capacity plan: the tokens the largest engine
rank holds across its tiers, in blocks; the longest prefix is one whole context. Expected
numbers are recomputed here from the plan's and the spec's fields."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import yaml

from longctx_core.api import serving_types as api_serving, spec as api
from longctx_core.sizing import kv_sizing, models, planner
from longctx_core.sizing.layout import Layout
from longctx_core.sizing.prefix_index import (derived_lru_capacity, gpu_tokens_per_rank,
                                         prefix_index, rank_tokens)
from longctx_core.quantity import GiB
from longctx_core.api.schema import object_schema
from tests.contract.variants import deep_merge

REPO = Path(__file__).resolve().parents[2]
OLD_LRU, OLD_MAX_PREFIX = 31250, 131072   # the fixed defaults this replaces


def load(name: str, **patch) -> api.LongContextDeploymentSpec:
    raw = yaml.safe_load((REPO / "examples" / name).read_text())["spec"]
    deep_merge(raw, patch)
    return api.load_spec(raw)


def test_glm_1m_is_sized_by_the_prefill_rank_gpu_kv_plus_its_cpu_offload():
    spec = load("glm-5.3-1m.yaml")
    plan = planner.plan(spec)
    bpt = plan.bytes_per_token.total
    lay = plan.prefill.layout
    assert (lay.prefillContextParallel, lay.decodeContextParallel, lay.pipelineParallel) == (8, 8, 1)
    # One PCP8 x DCP8 rank: each GPU holds 1/8 of the tokens (DCP), all layers (PP1).
    prefill = plan.prefill.budget.kv // bpt * 8 + 512 * GiB // bpt   # cpuOffloadPerRank 512Gi
    # HiSparse decode: MLA rows of 78 + 1 MTP layers in 64-token host pages of 52Gi, 2 spare.
    page = (plan.architecture.layers + plan.architecture.mtpLayers) * 64 \
        * models.mla_row_bytes(plan.architecture, "fp8")
    decode = (52 * GiB // page - 2) * 64
    tiers = {r.role: r for r in rank_tokens(spec, plan)}
    assert tiers["prefill"].total == prefill and tiers["decode"].total == decode
    assert tiers["decode"].gpu == tiers["decode"].cpu_offload == 0
    assert prefill > decode and prefill > 10_000_000      # ~10M offload + ~2.3M GPU
    index = prefix_index(spec, plan)
    assert index.lruCapacityPerServer == math.ceil(prefill / 64) > OLD_LRU
    assert index.maxPrefixTokensToMatch == spec.maxContextTokens == 1_048_576 > OLD_MAX_PREFIX
    assert index.blockSize == 64


def test_offload_decode_counts_its_gpu_kv_and_cpu_offload():
    spec = load("glm-5.3-baseline-b-offload-decode.yaml")
    plan = planner.plan(spec)
    bpt = plan.bytes_per_token.total
    lay = plan.decode.layout
    decode = plan.decode.budget.kv * lay.pipelineParallel // bpt * lay.decodeContextParallel \
        + 64 * GiB // bpt                                              # cpuOffloadPerRank 64Gi
    assert {r.role: r.total for r in rank_tokens(spec, plan)}["decode"] == decode


def test_pipeline_and_decode_context_parallelism_multiply_gpu_tokens():
    plan = planner.plan(load("glm-5.3-1m.yaml"))
    bpt = plan.bytes_per_token.total
    kv = plan.prefill.budget.kv
    cap = dataclasses.replace(plan.prefill, layout=Layout(pipelineParallel=2,
                                                          decodeContextParallel=4))
    # PP2: a GPU keeps half of each token's layers; DCP4: four GPUs split the tokens.
    assert gpu_tokens_per_rank(cap, bpt) == kv * 2 // bpt * 4
    unknown = dataclasses.replace(plan.prefill, budget=kv_sizing.Budget(None, "unknown"))
    assert gpu_tokens_per_rank(unknown, bpt) == 0


def test_block_size_divides_rounding_up():
    small = load("glm-5.3-1m.yaml")
    big = load("glm-5.3-1m.yaml", router={"prefixCache": {"blockSize": 128}})
    tokens = max(r.total for r in rank_tokens(small, planner.plan(small)))
    assert derived_lru_capacity(small) == math.ceil(tokens / 64)
    assert derived_lru_capacity(big) == math.ceil(tokens / 128)


def test_explicit_values_win():
    spec = load("glm-5.3-1m.yaml", router={"prefixCache": {
        "blockSize": 128, "maxPrefixTokensToMatch": 262144, "lruCapacityPerServer": 50000}})
    assert prefix_index(spec) == type(prefix_index(spec))(128, 262144, 50000)
    only_lru = load("glm-5.3-1m.yaml", router={"prefixCache": {"lruCapacityPerServer": 7}})
    assert prefix_index(only_lru).lruCapacityPerServer == 7
    assert prefix_index(only_lru).maxPrefixTokensToMatch == 1_048_576


def test_fields_are_optional_with_their_minimums():
    assert api_serving.PrefixCache().lruCapacityPerServer is None
    assert api_serving.PrefixCache().maxPrefixTokensToMatch is None
    props = object_schema(api_serving.PrefixCache)["properties"]
    for name in ("lruCapacityPerServer", "maxPrefixTokensToMatch"):
        # The apiserver enforces the minimum; no default, so absent means derived.
        assert props[name]["minimum"] == 1 and "default" not in props[name]
        assert "default" in props[name]["description"]
