"""What a decode loss costs a client (decode_loss.py), recomputed from the model's inputs:
the prefix read back from prefill's CPU offload over PCIe, the generated tail prefilled,
NIXL, one decode step; against a full re-prefill; and prefill generating alone."""

from __future__ import annotations

import pytest
import yaml

from longctx_core.api.spec import load_spec
from longctx_core.sizing import cost_terms, kv_sizing, models, performance, phase_timing, planner
from longctx_core.sizing.decode_loss import GENERATED_BEFORE_LOSS
from longctx_core.sizing.hardware import H200

from tests.core.planner_support import ONE_M, REPO, spec_with

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def spec():
    return spec_with()


def loss_at_max_context(spec) -> dict:
    return performance.summary_at_max_context(spec)["decodeLoss"]


def test_the_pause_is_the_prefix_from_the_cpu_offload_the_tail_nixl_and_a_step(spec):
    summary = performance.summary_at_max_context(spec)
    loss = summary["decodeLoss"]
    shape = cost_terms.model_shape(spec)
    prefill_layout, decode_layout = planner.role_layouts(spec)
    prefix = ONE_M - GENERATED_BEFORE_LOSS
    bpt = kv_sizing.kv_bytes_per_token(models.resolve_architecture(spec.model),
                                       spec.engine.kvCacheDtype)
    load = kv_sizing.kv_bytes_per_gpu(bpt, prefix, prefill_layout) / H200.pcieBytesPerS
    tail = phase_timing.prefill(shape, prefill_layout, H200, ONE_M, prefix).seconds
    transfer = phase_timing.kv_transfer_seconds(spec, H200, ONE_M)
    step = phase_timing.decode_step(spec, shape, decode_layout, H200, ONE_M,
                                    summary["concurrency"]).seconds
    full = phase_timing.prefill(shape, prefill_layout, H200, ONE_M).seconds
    assert loss["prefixInCpuOffload"]
    assert loss["prefixLoadSeconds"] == pytest.approx(load, abs=1e-4)
    assert loss["pauseSeconds"] == pytest.approx(load + tail + transfer + step, abs=1e-3)
    assert loss["fullReprefillPauseSeconds"] == pytest.approx(full + transfer + step, abs=1e-3)
    # At max context the prefix read back is what makes a continuation cheap.
    assert loss["pauseSeconds"] < loss["fullReprefillPauseSeconds"] / 10


def test_a_prefix_larger_than_a_prefill_ranks_offload_is_prefilled_again():
    small = spec_with(prefill={"cpuOffloadPerRank": "8Gi"})
    loss = loss_at_max_context(small)
    assert not loss["prefixInCpuOffload"]
    assert loss["pauseSeconds"] == loss["fullReprefillPauseSeconds"]


def test_with_no_decode_ready_prefill_generates_at_its_own_speed(spec):
    summary = performance.summary_at_max_context(spec)
    alone = summary["decodeLoss"]["prefillOnly"]
    shape = cost_terms.model_shape(spec)
    prefill_layout, _ = planner.role_layouts(spec)
    no_hisparse = spec_with(decode={"hiSparse": {"enabled": False}})
    step = phase_timing.decode_step(no_hisparse, shape, prefill_layout, H200, ONE_M,
                                    summary["concurrency"]).seconds
    held = planner.plan(spec).prefill.max_concurrent
    served = min(summary["concurrency"], held) / summary["concurrency"]
    per_user = phase_timing.acceptance_length(spec) / step * served
    assert alone["stepSeconds"] == pytest.approx(step, abs=1e-6)
    assert alone["requestsHeld"] == held
    assert alone["tokensPerSecondPerUser"] == pytest.approx(per_user, abs=0.01)
    assert alone["speedOfPd"] == pytest.approx(
        per_user / summary["decode"]["tokensPerSecondPerUser"], abs=2e-3)
    # No transfer: the pause is the replay and one step of prefill's own.
    loss = summary["decodeLoss"]
    replay = loss["prefixLoadSeconds"] + loss["replayPrefillSeconds"]
    assert alone["pauseSeconds"] == pytest.approx(replay + step, abs=1e-3)


def test_the_generated_tokens_come_from_the_workload():
    spec = spec_with()
    perf = performance.predict(spec, performance.Workload(65536, output_tokens=2000))
    assert (perf["decodeLoss"]["contextTokens"], perf["decodeLoss"]["generatedTokens"]) == (
        67536, 2000)
    short = performance.predict(spec, performance.Workload(100))["decodeLoss"]
    assert short["generatedTokens"] == 99      # never more than the context less one token


def decode_loss_table() -> list[str]:
    """docs/performance.md's table of the priced examples' decode loss, from the model."""
    from longctx_core.sizing.plan_report import _seconds
    rows = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = load_spec(yaml.safe_load(path.read_text())["spec"])
        perf = performance.summary_at_max_context(spec)
        if perf is None:
            continue     # an explicit architecture: not priced
        loss, alone = perf["decodeLoss"], perf["decodeLoss"]["prefillOnly"]
        rows.append(
            f"| {path.name} | {loss['contextTokens']:,} | {_seconds(loss['prefixLoadSeconds'])} "
            f"| {_seconds(loss['pauseSeconds'])} | {_seconds(loss['fullReprefillPauseSeconds'])} "
            f"| {_seconds(alone['pauseSeconds'])} | {alone['tokensPerSecondPerUser']:,.1f} of "
            f"{perf['decode']['tokensPerSecondPerUser']:,.1f} ({perf['concurrency']} "
            f"concurrent) |")
    return rows


def test_the_documented_decode_losses_are_the_models():
    text = (REPO / "docs" / "performance.md").read_text()
    table = text.split("<!-- decode-loss -->\n", 1)[1].split(
        "<!-- /decode-loss -->", 1)[0].splitlines()[2:]
    assert table == decode_loss_table(), "docs/performance.md, the examples' decode loss; " \
        "the model gives:\n" + "\n".join(decode_loss_table())
