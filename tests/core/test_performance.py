"""The performance model against the seed article's figures, and its hardware profiles."""

from __future__ import annotations

import dataclasses
import json

import pytest

from longctx_core.api import spec as api
from longctx_core.sizing import (cost_terms, hardware, kv_sizing, models, performance,
                                 phase_timing, planner)
from longctx_core.sizing.hardware import H200
from longctx_core.sizing.plan_report import render_performance_line

from tests.core.planner_support import DP8_PREFILL, example_spec, spec_with

K = 1024
ONE_M = 1 << 20


@pytest.fixture(scope="module")
def spec():
    return spec_with()


@pytest.fixture(scope="module")
def shape(spec):
    return cost_terms.model_shape(spec)


@pytest.fixture(scope="module")
def layouts(spec):
    return planner.role_layouts(spec)


def test_shape_is_glm_5_3_with_40b_active_parameters(shape):
    active = shape.replicated_bytes + shape.expert_bytes * shape.experts_per_token * shape.moe_layers
    assert active == pytest.approx(40e9, rel=0.03)   # GLM-5: 40B active of 744B
    assert (shape.layers, shape.index_layers, shape.row, shape.index_row) == (79, 22, 656, 132)


def _dcp_overhead(shape, layout, context, chunk=2048):
    with_dcp = phase_timing.prefill_chunk(shape, layout, H200, chunk, context)
    without = phase_timing.prefill_chunk(shape, phase_timing.without_dcp(layout), H200, chunk,
                                        context)
    return phase_timing.dcp_overhead(with_dcp, without)


def test_pcp_dcp_prefill_gathers_the_whole_sequence_as_bf16_every_layer(shape, layouts):
    """vLLM 0.33's PCP x DCP prefill (flashmla_sparse `_gather_prefill_chunk`, the indexer's
    `dcp_gather_kv_rows`): each GPU upconverts its 1/8 shard of the sequence and the group
    all-gathers the 1152-B rows (and the 132-B indexer keys) into a full copy, every layer."""
    prefill, _ = layouts
    context, chunk = 64 * K, 2048
    step = phase_timing.prefill_chunk(shape, prefill, H200, chunk, context)
    moved = 7 / 8 * (context + chunk) * (1152 * 79 + 132 * 22)
    collectives = 79 + 2 * 22
    assert step.terms["dcpAllGather"] == pytest.approx(
        moved / H200.nvlinkBytesPerS + collectives * H200.collectiveLatencyS)
    without = phase_timing.prefill_chunk(shape, phase_timing.without_dcp(prefill), H200, chunk,
                                        context)
    # Without DCP every GPU upconverts the whole sequence itself: 8x the rows.
    assert without.terms["kvUpconvert"] == pytest.approx(8 * step.terms["kvUpconvert"])
    assert "dcpAllGather" not in without.terms


def test_dcp8_overhead_grows_with_the_cached_context_as_the_seed_says(shape, layouts):
    """The seed: a 2K-token chunk on PCP8 pays ~6% for DCP8 up to 64K cached tokens and ~15%
    at 248K. The model reaches the short end (8K) and the growth from 64K to 248K within the
    issue's 40%; at 64K and 248K themselves it does not (18% and 50%: vLLM's gather of the
    whole sequence in bf16 is bandwidth no measured kernel of the step outweighs;
    docs/performance.md)."""
    prefill, _ = layouts
    at_8k, at_64k, at_248k = (_dcp_overhead(shape, prefill, c * K) for c in (8, 64, 248))
    assert at_8k == pytest.approx(0.06, rel=0.4)
    assert at_8k < at_64k < at_248k
    assert at_248k / at_64k == pytest.approx(15 / 6, rel=0.4)


def test_the_seeds_dcp8_overhead_at_64k_needs_a_step_beyond_the_model(shape, layouts):
    """Even at NVLink 4's 450 GB/s line rate, with no protocol overhead, vLLM's gather of a 64K
    context is more than the seed's 6% + 40% of the modelled PCP8 step: the seed's step must be
    longer than the model's (what docs/performance.md says is not modelled)."""
    prefill, _ = layouts
    peak = dataclasses.replace(H200, nvlinkBytesPerS=450e9)
    with_dcp = phase_timing.prefill_chunk(shape, prefill, peak, 2048, 64 * K)
    without = phase_timing.prefill_chunk(shape, phase_timing.without_dcp(prefill), peak, 2048,
                                        64 * K)
    assert phase_timing.dcp_overhead(with_dcp, without) > 1.4 * 0.06


def test_read_as_2k_a_gpu_the_dcp8_overhead_is_within_40_percent_of_the_seed(shape, layouts):
    """The seed's "2K-token chunk" read as 2K queries a GPU (a 16K-token step on PCP8): the
    same gather and step give ~6% at 64K and ~15% at 248K (docs/performance.md)."""
    prefill, _ = layouts
    assert _dcp_overhead(shape, prefill, 64 * K, chunk=16 * K) == pytest.approx(0.06, rel=0.4)
    assert _dcp_overhead(shape, prefill, 248 * K, chunk=16 * K) == pytest.approx(0.15, rel=0.4)


def test_gemm_efficiency_follows_the_rows_a_gpu_computes():
    """Measured at 256 rows ("gemmFewRows") and from 1024 up ("gemm"); between, on log(rows)."""
    eff = cost_terms.gemm_efficiency
    assert eff(H200, 64) == eff(H200, 256) == H200.eff("gemmFewRows")
    assert eff(H200, 1024) == eff(H200, 8192) == H200.eff("gemm")
    assert eff(H200, 512) == pytest.approx((H200.eff("gemmFewRows") + H200.eff("gemm")) / 2)


def test_prefill_top_k_scans_the_logits_then_selects_in_fixed_time(shape, layouts):
    """The measured radix top-k: a fixed selection per call and a scan of the fp32 logits at
    the copy bandwidth, one call per indexer layer and chunk."""
    prefill, _ = layouts
    short, long = (phase_timing.prefill_chunk(shape, prefill, H200, 2048, c * K).terms
                   ["indexerTopK"] for c in (64, 248))
    fixed = shape.index_layers * H200.topkSelectS
    scanned = 4 * 256 * 184 * K * shape.index_layers   # 184K more keys for each of 256 queries
    assert long - short == pytest.approx(scanned / H200.hbmBytesPerS)
    assert short > fixed


def test_a_prefill_step_pays_eager_launches_and_a_decode_step_graphed_ones(spec, shape, layouts):
    prefill, decode = layouts
    pcp_dcp = phase_timing.prefill_chunk(shape, prefill, H200, 2048, 64 * K).terms["launches"]
    pcp = phase_timing.prefill_chunk(shape, phase_timing.without_dcp(prefill), H200, 2048,
                                    64 * K).terms["launches"]
    assert pcp == pytest.approx(cost_terms.KERNELS_PER_LAYER * shape.layers * H200.eagerKernelS)
    assert pcp_dcp - pcp == pytest.approx(H200.eagerKernelS * (
        cost_terms.DCP_GATHER_KERNELS_PER_LAYER * shape.layers
        + cost_terms.DCP_GATHER_KERNELS_PER_INDEX_LAYER * shape.index_layers))
    step = phase_timing.decode_step(spec, shape, decode, H200, 64 * K, 8)
    assert step.costs.terms["launches"] > 0
    graphed = dataclasses.replace(H200, kernelLaunchS=2 * H200.kernelLaunchS)
    assert phase_timing.decode_step(spec, shape, decode, graphed, 64 * K, 8).costs.terms[
        "launches"] == pytest.approx(2 * step.costs.terms["launches"])


def test_dcp_decode_moves_queries_and_partial_outputs_not_the_kv(spec, shape):
    """DCP decode (`ag_rs`) keeps the KV sharded: what crosses the link is the queries, the
    partial outputs with their LSE, and the indexer's local top-k candidates, so it does not
    grow with the context."""
    layout = dataclasses.replace(planner.role_layouts(spec)[1], tensorParallel=8,
                                 decodeContextParallel=8, dataParallel=1)
    short = phase_timing.decode_step(spec, shape, layout, H200, 64 * K, 8)
    long = phase_timing.decode_step(spec, shape, layout, H200, ONE_M, 8)
    assert short.costs.terms["dcpCombine"] == long.costs.terms["dcpCombine"] > 0
    assert "dcpAllGather" not in long.costs.terms


def test_pcp8_dcp8_ttft_is_below_dp8_for_every_prompt_from_64k(spec):
    dp8 = spec_with(prefill=DP8_PREFILL)
    for prompt in (64 * K, 96 * K, 128 * K, 192 * K, 256 * K):
        ours = performance.predict(spec, performance.Workload(prompt))["ttftSeconds"]
        theirs = performance.predict(dp8, performance.Workload(prompt))["ttftSeconds"]
        assert ours < theirs, prompt


def test_agentx_ttft_ratio_of_dp8_to_pcp8_dcp8_is_inside_the_seeds_range(spec):
    """The seed's median TTFTs, 1.5-5.2 s for DP8 against 0.8-0.9 s, bound the ratio to
    1.7-6.5. The model prices one turn alone (66,000 cached + 4,096 new tokens, an assumed
    AgentX turn), so only the ratio is checked; the absolute TTFTs are not reached (no
    queueing: docs/performance.md)."""
    turn = performance.Workload(66_000 + 4_096, 66_000, 1_000, 16)
    ours = performance.predict(spec, turn)["ttftSeconds"]
    theirs = performance.predict(spec_with(prefill=DP8_PREFILL), turn)["ttftSeconds"]
    assert 1.5 / 0.9 <= theirs / ours <= 5.2 / 0.8


def test_dp8_prefill_and_offload_only_decode_are_refused_at_1m(spec):
    rows = {r["name"]: r for r in performance.compare(spec, performance.Workload(ONE_M))}
    assert rows["this spec"]["fitsMaxContext"] and rows["this spec"]["ttftSeconds"]
    assert rows["DP8 prefill + offload"]["refusedRoles"] == ["prefill"]
    assert rows["DP8 prefill + offload"]["ttftSeconds"] is None
    assert rows["offload-only decode"]["refusedRoles"] == ["decode"]
    assert rows["offload-only decode"]["tokensPerSecondPerUser"] is None


def test_ttft_grows_faster_than_linearly_beyond_the_indexer_crossover(shape, layouts):
    prefill, _ = layouts
    crossover = kv_sizing.indexer_crossover_tokens(models.PRESETS["glm-5.3"], 64)
    previous = phase_timing.prefill(shape, prefill, H200, crossover)
    for tokens in (2 * crossover, 4 * crossover):
        now = phase_timing.prefill(shape, prefill, H200, tokens)
        assert now.seconds > 2.2 * previous.seconds
        assert now.terms["indexer"] > 3.5 * previous.terms["indexer"]
        previous = now


def test_the_model_counts_the_indexer_crossover_the_planner_reports(shape, layouts):
    """From the model's own FLOPs: a from-scratch prefill's indexer work equals sparse MLA's
    at the planner's crossover (~256K under PCP8)."""
    prefill, _ = layouts
    crossover = kv_sizing.indexer_crossover_tokens(models.PRESETS["glm-5.3"], 64)
    mla = shape.mla_flops_per_key * shape.heads * crossover * shape.top_k * (shape.layers - 1)
    indexer = shape.index_flops_per_key * crossover ** 2 / 2 * (shape.index_layers - 1)
    assert indexer == pytest.approx(mla, rel=0.01)


def test_decode_step_grows_with_context_only_through_the_indexer(spec, shape, layouts):
    _, decode = layouts
    short = phase_timing.decode_step(spec, shape, decode, H200, 64 * K, 64)
    long = phase_timing.decode_step(spec, shape, decode, H200, ONE_M, 64)
    grew = {t for t in long.costs.terms
            if long.costs.terms[t] > short.costs.terms[t] * (1 + 1e-9)}
    assert grew == {"indexer"}
    assert long.costs.terms["sparseMla"] == short.costs.terms["sparseMla"]
    assert long.host_gather_seconds == short.host_gather_seconds   # fixed top-k misses


def test_the_figures_change_with_the_hardware_profile(spec):
    workload = performance.Workload(128 * K, concurrency=32)
    base = performance.predict(spec, workload)
    slow_hbm = dataclasses.replace(H200, hbmBytesPerS=H200.hbmBytesPerS / 2)
    slow_link = dataclasses.replace(H200, nvlinkBytesPerS=H200.nvlinkBytesPerS / 2,
                                    rdmaBytesPerS=H200.rdmaBytesPerS / 2)
    hbm = performance.predict(spec, workload, slow_hbm)
    link = performance.predict(spec, workload, slow_link)
    assert hbm["decode"]["stepSeconds"] > 1.5 * base["decode"]["stepSeconds"]
    assert link["prefill"]["dcpAllGatherSeconds"] > 1.9 * base["prefill"]["dcpAllGatherSeconds"]
    assert link["kvTransfer"]["seconds"] > 1.9 * base["kvTransfer"]["seconds"]


def test_profile_round_trips_through_json(tmp_path):
    measured = dataclasses.replace(H200, name="node-7", hbmBytesPerS=4.0e12,
                                   efficiency={**H200.efficiency, "hbm": 0.6})
    path = tmp_path / "node.json"
    hardware.save_profile(measured, path)
    assert hardware.load_profile(path) == measured
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"name": "x", "pcieBytesPerS": 30e9}))
    loaded = hardware.load_profile(partial)
    assert loaded.pcieBytesPerS == 30e9 and loaded.hbmBytesPerS == H200.hbmBytesPerS


@pytest.mark.parametrize("data, field", [
    ({"hbmBytesPerS": -1}, "hbmBytesPerS"),
    ({"hbmBytesPerS": "fast"}, "hbmBytesPerS"),
    ({"nvlink": 1e9}, "nvlink"),
    ({"efficiency": {"hbm": 1.5}}, "efficiency.hbm"),
    ({"efficiency": {"warp": 0.5}}, "efficiency.warp"),
])
def test_a_bad_profile_names_the_field(tmp_path, data, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        hardware.load_profile(path)


def test_summary_at_max_context_is_the_status_plan_prediction(spec):
    summary = performance.summary_at_max_context(spec)
    assert summary["promptTokens"] == spec.maxContextTokens
    assert summary["concurrency"] == planner.plan(spec).decode.max_concurrent
    assert summary["ttftSeconds"] > summary["prefill"]["seconds"] > 0
    assert summary["prefill"]["bound"] in ("compute", "HBM", "interconnect", "PCIe", "launch")
    line = render_performance_line(summary)
    assert line.count("\n") == 1 and "TTFT" in line and "tok/s/user" in line


def test_an_explicit_architecture_is_not_priced():
    raw = example_spec()
    arch = models.PRESETS["glm-5.3"]
    raw["model"].pop("preset")
    raw["model"]["architecture"] = {f.name: getattr(arch, f.name)
                                    for f in dataclasses.fields(arch)}
    spec = api.load_spec(raw)
    assert performance.summary_at_max_context(spec) is None
    assert "explicit architecture" in render_performance_line(None)


@pytest.mark.parametrize("workload, flag", [
    (performance.Workload(0), "--prompt-tokens"),
    (performance.Workload(100, cached_tokens=100), "--cached-tokens"),
    (performance.Workload(100, concurrency=0), "--concurrency"),
    (performance.Workload(100, acceptance_length=0.5), "--acceptance-length"),
])
def test_bad_workload_names_the_flag(spec, workload, flag):
    with pytest.raises(ValueError, match=flag):
        performance.predict(spec, workload)
