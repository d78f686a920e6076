"""The capacity planner reproduces the seed's GLM-5.3 figures for the example, and refuses
layouts that cannot hold maxContextTokens, naming what to change."""

from __future__ import annotations

import json
import math
import re

import pytest

from longctx_core.api import spec as api
from longctx_core.sizing import planner
from longctx_core.api.spec import load_spec
from longctx_core.quantity import GiB
from tests.core.planner_support import (DP8_PREFILL, GLM, K, ONE_M, example_spec, offered_value,
                                          spec_with)


# ------------------------------------------------------------ the example and the baselines


def test_example_prefill_fits_with_the_seed_figures():
    plan = planner.plan(load_spec(example_spec()))
    out = plan.to_json()
    assert out["kvBytesPerToken"] == {"mla": 51168, "indexer": 2772, "mtp": 788, "total": 54728}
    assert out["request"]["kvGiB"] == pytest.approx(53.4, abs=0.06)
    assert out["prefill"]["fits"] is True
    assert out["prefill"]["kvGiBPerGpu"] == pytest.approx(6.7, abs=0.05)
    assert out["prefill"]["sparseMlaFlopsPerByte"] == pytest.approx(191, abs=0.5)
    assert out["prefill"]["indexerCrossoverTokens"] == pytest.approx(256 * K, rel=0.03)
    # The seed: "cada GPU solo tiene espacio para unos 15 GiB".
    assert out["prefill"]["kvBudgetGiBPerGpu"] == pytest.approx(15, abs=1.5)


def test_example_decode_fits_exactly_when_its_host_pool_holds_a_request():
    out = planner.plan(load_spec(example_spec())).to_json()
    hs = out["decode"]["hiSparse"]
    assert out["decode"]["fits"] is (hs["hostPoolGiBPerRank"] >= hs["hostPoolMinGiBPerRank"])
    assert out["fits"] is out["decode"]["fits"]


@pytest.mark.parametrize("pool, fits, per_rank", [
    ("48Gi", False, 0),    # 79 layers x 656 B x 1M tokens = 50.6 GiB > 48 GiB
    ("51Gi", True, 1),
    ("104Gi", True, 2),
])
def test_hisparse_decode_host_pool(pool, fits, per_rank):
    plan = planner.plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": pool}}))
    out = plan.to_json()
    assert out["decode"]["hiSparse"]["hostPoolRequestsPerRank"] == per_rank
    assert out["decode"]["fits"] is fits
    # Concurrency = per-rank requests x ranks x pods.
    assert out["decode"]["maxConcurrentAtMaxContext"] == per_rank * 8
    if not fits:
        assert "spec.decode.hiSparse.hostPoolPerRank" in plan.refusal
        assert "at least 51Gi" in plan.refusal
    else:
        assert plan.fits and plan.refusal is None


def test_hisparse_min_pool_is_vllms_page_rule():
    need = planner.hisparse_min_pool_bytes(GLM, ONE_M)
    assert need == (ONE_M // 64 + 2) * 79 * 64 * 656
    assert 50 * GiB < need < 51 * GiB


def test_decode_concurrency_scales_with_replicas():
    one = planner.plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": "51Gi"}}))
    two = planner.plan(spec_with(decode={"replicas": 2, "hiSparse": {"hostPoolPerRank": "51Gi"}}))
    assert two.decode.max_concurrent == 2 * one.decode.max_concurrent == 16


def test_dp8_prefill_baseline_does_not_fit_and_says_what_to_change():
    plan = planner.plan(spec_with(prefill=DP8_PREFILL))
    assert not plan.prefill.fits and not plan.fits
    out = plan.to_json()
    assert out["prefill"]["kvGiBPerGpu"] == pytest.approx(53.4, abs=0.06)
    refusal = plan.refusal
    assert "spec.prefill.contextParallel.decode" in refusal
    assert "spec.prefill.contextParallel.prefill" in refusal
    # The suggested DCP is the smallest power of two whose shard fits the budget.
    budget = plan.prefill.budget.kv
    smallest = next(n for n in (1, 2, 4, 8)
                    if math.ceil(ONE_M / n) * 54728 <= budget)
    assert f"to {smallest} (the smallest" in refusal
    assert "spec.maxContextTokens" in refusal
    # Offload capacity: 64 GiB per rank of whole 54,728-byte tokens, 8 ranks.
    assert out["prefill"]["cpuOffloadTokensPerRank"] == 64 * GiB // 54728
    assert out["prefill"]["cpuOffloadTokens"] == 8 * (64 * GiB // 54728)


def test_offload_only_decode_does_not_fit_one_million_tokens():
    # The seed's offload-only baseline: 16 GiB of CPU offload per rank, no HiSparse.
    plan = planner.plan(spec_with(decode={"hiSparse": {"enabled": False},
                                          "cpuOffloadPerRank": "16Gi"}))
    assert not plan.decode.fits and not plan.fits
    out = plan.to_json()
    assert out["decode"]["maxConcurrentAtMaxContext"] == 0
    assert out["decode"]["kvGiBPerGpu"] == pytest.approx(53.4, abs=0.06)
    assert "spec.decode.hiSparse.enabled" in plan.refusal
    assert "spec.decode.contextParallel.decode" in plan.refusal
    # The offload tier holds whole tokens when HiSparse is off.
    assert out["decode"]["cpuOffloadTokensPerRank"] == 16 * GiB // 54728


def test_offload_only_decode_fits_a_short_context():
    plan = planner.plan(spec_with(maxContextTokens=131072, decode={"hiSparse": {"enabled": False}}))
    assert plan.decode.fits
    assert plan.decode.max_concurrent == plan.decode.budget.kv // (131072 * 54728) * 8


# ------------------------------------------------------------ inputs


@pytest.mark.parametrize("budget, prefill_fits", [("6Gi", False), ("7Gi", True), ("80Gi", True)])
def test_kv_budget_override(budget, prefill_fits):
    plan = planner.plan(spec_with(capacity={"kvBudgetPerGpu": budget}))
    out = plan.to_json()
    assert out["prefill"]["kvBudgetSource"] == "spec.capacity.kvBudgetPerGpu"
    assert out["prefill"]["kvBudgetGiBPerGpu"] == float(budget[:-2])
    assert out["prefill"]["fits"] is prefill_fits
    if not prefill_fits:
        assert "spec.capacity.kvBudgetPerGpu is 6.0 GiB" in plan.refusal


def test_override_makes_dp8_prefill_fit():
    plan = planner.plan(spec_with(prefill=DP8_PREFILL, capacity={"kvBudgetPerGpu": "60Gi"}))
    assert plan.prefill.fits
    assert plan.prefill.max_concurrent == 8


def test_explicit_architecture_matches_the_preset():
    arch = {f: getattr(GLM, f) for f in ("layers", "mtpLayers", "attentionHeads", "kvLoraRank",
                                          "qkRopeHeadDim", "indexLayers", "indexHeads",
                                          "indexHeadDim", "indexTopK", "parameterBytes",
                                          "replicatedParameterBytes")}
    raw = example_spec()
    raw["model"].pop("preset")
    raw["model"]["architecture"] = arch
    explicit = planner.plan(load_spec(raw)).to_json()
    preset = planner.plan(load_spec(example_spec())).to_json()
    assert explicit["model"]["preset"] is None
    explicit["model"]["preset"] = preset["model"]["preset"]
    assert explicit == preset


def test_explicit_architecture_without_weights_needs_a_budget():
    raw = example_spec()
    raw["model"].pop("preset")
    raw["model"]["architecture"] = {"layers": 61, "mtpLayers": 1, "attentionHeads": 128,
                                    "kvLoraRank": 512, "qkRopeHeadDim": 64, "indexLayers": 61,
                                    "indexHeads": 64, "indexHeadDim": 128, "indexTopK": 2048}
    plan = planner.plan(load_spec(raw))
    assert not plan.fits and "spec.capacity.kvBudgetPerGpu" in plan.refusal
    raw["capacity"] = {"kvBudgetPerGpu": "20Gi"}
    raw["decode"]["hiSparse"]["hostPoolPerRank"] = "64Gi"
    plan = planner.plan(load_spec(raw))
    # DSV3.2: 61 x 656 + 61 x 132 + 1 x 788 = 48,856 B/token.
    assert plan.bytes_per_token.total == 61 * 656 + 61 * 132 + 788
    assert plan.prefill.fits


def test_deepseek_preset_plans():
    raw = example_spec()
    raw["model"]["preset"] = "deepseek-v3.2"
    raw["maxContextTokens"] = 163840
    out = planner.plan(load_spec(raw)).to_json()
    assert out["kvBytesPerToken"]["total"] == 48856
    assert out["prefill"]["fits"] and out["decode"]["fits"]
    # 128 heads per GPU under PCP: 2048 x 2176 x 128 / (2048 x 660 + 128 x 2176).
    assert out["prefill"]["sparseMlaFlopsPerByte"] == pytest.approx(
        2048 * 2176 * 128 / (2048 * 660 + 128 * 2176), abs=0.05)


# ------------------------------------------------------------ JSON contract


REQUIRED_KEYS = ["kvBytesPerToken.mla", "kvBytesPerToken.indexer", "kvBytesPerToken.mtp",
                 "kvBytesPerToken.total", "request.kvGiB", "prefill.kvGiBPerGpu", "prefill.fits",
                 "prefill.sparseMlaFlopsPerByte", "prefill.indexerCrossoverTokens",
                 "decode.maxConcurrentAtMaxContext", "decode.fits",
                 "prefill.kvBudgetGiBPerGpu", "decode.kvBudgetGiBPerGpu",
                 "decode.hiSparse.hostPoolGiBPerRank", "prefill.cpuOffloadTokens",
                 "decode.cpuOffloadTokens", "fits", "refusal"]


@pytest.mark.parametrize("changes", [
    {},
    {"prefill": DP8_PREFILL},
    {"decode": {"hiSparse": {"enabled": False}}},
    {"capacity": {"kvBudgetPerGpu": "20Gi"}},
])
def test_to_json_has_the_keys_and_is_strict_json(changes):
    out = planner.plan(spec_with(**changes)).to_json()
    for dotted in REQUIRED_KEYS:
        node = out
        for part in dotted.split("."):
            if dotted.startswith("decode.hiSparse") and changes.get("decode"):
                break
            assert part in node, dotted
            node = node[part]
    text = json.dumps(out, allow_nan=False, sort_keys=True)
    assert json.loads(text) == out
    # Stable: the same spec gives the same plan.
    assert json.dumps(planner.plan(spec_with(**changes)).to_json(), sort_keys=True) == text


def test_capacity_plan_is_frozen():
    plan = planner.plan(load_spec(example_spec()))
    with pytest.raises(AttributeError):
        plan.refusal = "x"  # type: ignore[misc]


# ------------------------------------------------------------ every refusal offers a value that fits


def test_an_unknown_kv_budget_is_refused_with_the_budget_one_request_needs():
    arch = {k: v for k, v in api.dump(GLM).items() if k not in ("parameterBytes",
                                                                 "replicatedParameterBytes")}
    spec = spec_with(model={"preset": None, "architecture": arch})
    plan = planner.plan(spec)
    assert not plan.fits
    # Both roles are refused, each with what it needs: the larger fits both.
    offered = re.findall(r"kvBudgetPerGpu to at least (\d+)Gi", plan.refusal)
    budget = f"{max(int(v) for v in offered)}Gi"
    assert planner.plan(spec_with(model={"preset": None, "architecture": arch},
                                  capacity={"kvBudgetPerGpu": budget})).fits


def test_a_hisparse_request_too_large_for_the_gpu_is_refused_with_a_context_that_fits():
    spec = spec_with(capacity={"kvBudgetPerGpu": "2Gi"})
    plan = planner.plan(spec)
    assert not plan.fits and "HiSparse request keeps" in plan.refusal
    tokens = int(offered_value(r"HiSparse request keeps .*?maxContextTokens to at most (\d+)",
                               plan.refusal))
    assert planner.plan(spec_with(capacity={"kvBudgetPerGpu": "2Gi"},
                                  maxContextTokens=tokens)).decode.fits
    assert not planner.plan(spec_with(capacity={"kvBudgetPerGpu": "2Gi"},
                                      maxContextTokens=tokens + 64)).decode.fits

