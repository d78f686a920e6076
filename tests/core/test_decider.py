"""`decider: auto`: the prefix-based decider's threshold from the performance model (GPU) and
the CPU calibration, what the picker renders from it, and what `longctx plan` shows."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longctx_core.api.spec import load_spec
from longctx_core.sizing import decider as decider_mod
from longctx_core.sizing.cpu_costs import cpu_costs
from longctx_core.sizing.decider import (ALWAYS, PREFIX_BASED, Turn, crossover, decider,
                                         disaggregation_report, priced_context, threshold,
                                         turn_pricer)
from longctx_operator.controller.builders.picker import picker_config
from tests.core.planner_support import DP8_PREFILL, REPO, spec_with

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def example(path: Path):
    return load_spec(yaml.safe_load(path.read_text())["spec"])


def auto(**changes):
    return spec_with(router={"disaggregation": {"decider": "auto"}}, **changes)


def plugin(spec, kind: str) -> dict:
    (found,) = [p for p in picker_config(spec)["plugins"] if p["type"] == kind]
    return found


# ---------------------------------------------------------------- the crossover


def _linear(direct_per: float, direct_fixed: float, through_per: float,
            through_fixed: float):
    return lambda n, _context: Turn(n, direct_fixed + direct_per * n,
                                    through_fixed + through_per * n, 0.0, 0.0)


def test_crossover_is_the_first_size_through_prefill_is_faster():
    # Through prefill 30 + n beats straight to decode 1 + 2n from n = 30.
    assert crossover(_linear(2, 1, 1, 30), 0, 1000) == 30
    assert crossover(_linear(2, 1, 1, 30), 0, 29) is None
    assert crossover(_linear(1, 0, 1, 5), 0, 10**6) is None      # same slope: never
    assert crossover(_linear(5, 10, 1, 0), 0, 100) == 1            # always faster


def test_default_decider_is_auto():
    raw = yaml.safe_load((REPO / "examples" / "glm-5.3-1m.yaml").read_text())["spec"]
    del raw["router"]["disaggregation"]
    assert load_spec(raw).router.disaggregation.decider == "auto"


# ---------------------------------------------------------------- GPU layouts


def test_pcp_prefill_pays_back_from_about_a_thousand_new_tokens():
    """PCP8 x DCP8 prefill computes a token on eight GPUs, a decode rank on one: straight to
    decode wins short turns (the prefill leg's decode step, launches and transfer are fixed
    costs) and loses long ones."""
    spec = auto()
    t = threshold(spec)
    assert t.decider == PREFIX_BASED and 500 < t.non_cached_tokens < 2000, t
    turn = turn_pricer(spec)
    context = priced_context(spec)
    at, below = turn(t.non_cached_tokens, context), turn(t.non_cached_tokens - 1, context)
    assert at.disaggregated_s < at.direct_s
    assert below.disaggregated_s >= below.direct_s
    # Four times the threshold: through prefill is clearly faster.
    far = turn(4 * t.non_cached_tokens, context)
    assert far.disaggregated_s < 0.7 * far.direct_s


def test_prefill_no_faster_than_decode_never_disaggregates():
    """DP8 prefill ranks are the decode ranks' size: the prefill leg only adds time."""
    t = threshold(auto(prefill=DP8_PREFILL))
    assert (t.decider, t.non_cached_tokens, t.crossover_tokens) == (PREFIX_BASED, 0, None)
    assert "never pays back" in t.reason


def test_explicit_architecture_on_gpus_is_disaggregated_and_says_why():
    spec = auto(model={"preset": None, "architecture": {
        "layers": 61, "attentionHeads": 128, "kvLoraRank": 512, "qkRopeHeadDim": 64,
        "parameterBytes": "700Gi"}})
    t = threshold(spec)
    assert t.decider == ALWAYS and "prefix-based" in t.reason


# ---------------------------------------------------------------- what the picker gets


def test_picker_renders_the_derived_threshold():
    spec = auto()
    assert plugin(spec, PREFIX_BASED)["parameters"] == {
        "nonCachedTokens": threshold(spec).non_cached_tokens, "promptTokens": 0}
    handler = plugin(spec, "disagg-profile-handler")
    assert handler["parameters"]["deciders"]["prefill"] == PREFIX_BASED


def test_an_explicit_number_or_always_still_wins():
    spec = spec_with(router={"disaggregation": {"decider": "prefix-based",
                                                "nonCachedTokens": 2048}})
    assert plugin(spec, PREFIX_BASED)["parameters"]["nonCachedTokens"] == 2048
    always = spec_with(router={"disaggregation": {"decider": "always"}})
    assert plugin(always, ALWAYS) == {"type": ALWAYS}
    assert decider(always).decider == ALWAYS


# ---------------------------------------------------------------- CPU platform


@pytest.mark.parametrize("context", [None, 4096], ids=["example", "day-two-context"])
def test_cpu_threshold_comes_from_the_calibration(context):
    """The CPU example is priced by the measured costs: the closed form of the fitted lines
    (fixed + per token, per byte for NIXL) gives the same crossover as the search, at the
    example's context and at the day-two deployment's (tests/cluster/day_two)."""
    spec = example(REPO / "examples" / "tiny-mla-cpu.yaml")
    if context:
        spec = dataclasses.replace(spec, maxContextTokens=context)
    t = threshold(spec)
    assert t.priced_by.startswith("CPU calibration")
    c = cpu_costs()
    per_token = decider_mod.kv_bytes_per_token(spec)
    fixed_gap = (c.prefill.fixed + c.decode_leg.fixed + c.kv_transfer.fixed
                 - c.decode_extension.fixed)
    slope_gap = (c.decode_extension.per_unit - c.prefill.per_unit - c.decode_leg.per_unit
                 - c.kv_transfer.per_unit * per_token)
    most = spec.maxContextTokens - priced_context(spec)
    if slope_gap <= 0 or fixed_gap / slope_gap >= most:
        assert (t.non_cached_tokens, t.crossover_tokens) == (0, None), t
    else:
        assert t.crossover_tokens == max(int(fixed_gap / slope_gap) + 1, 1), t


def test_a_broken_calibration_names_the_file_and_the_rerun(tmp_path, monkeypatch):
    from longctx_core.sizing import cpu_costs as module
    bad = tmp_path / "cpu_costs.json"
    bad.write_text(json.dumps({"prefill": {"fixedSeconds": 0.01}}))
    monkeypatch.setattr(module, "DATA_FILE", bad)
    module.cpu_costs.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"prefill\.perTokenSeconds.*benchmarks/cpu_costs"):
            module.cpu_costs()
    finally:
        module.cpu_costs.cache_clear()


# ---------------------------------------------------------------- longctx plan


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_plan_shows_the_threshold_and_why_for_every_example(path):
    proc = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "plan", "-f",
                           str(path), "-o", "json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode in (0, 3), proc.stderr
    report = json.loads(proc.stdout)["disaggregation"]
    spec = example(path)
    assert report == disaggregation_report(spec)
    assert report["reason"]
    if report["decider"] == ALWAYS:      # through prefill from the first token, or unpriced
        assert report["nonCachedTokens"] == 0 and report["crossoverTokens"] in (None, 1)
    elif report["crossoverTokens"] is None:     # never pays back
        assert report["nonCachedTokens"] == 0
    else:
        assert report["nonCachedTokens"] == report["crossoverTokens"] > 1
    table = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "plan", "-f",
                            str(path)], capture_output=True, text=True, timeout=120).stdout
    assert "Disaggregation threshold (auto" in table
    sys.__stdout__.write(f"\n[decider] {path.name}: nonCachedTokens "
                         f"{report['nonCachedTokens']} ({report['pricedBy']})\n")


def thresholds_table() -> list[str]:
    """docs/performance.md's table of the examples' auto thresholds, from the model."""
    from longctx_core.sizing import planner
    rows = []
    for path in EXAMPLES:
        spec = example(path)
        t = threshold(spec)
        prefill_layout, decode_layout = planner.role_layouts(spec)
        value = (f"{t.non_cached_tokens:,}" if t.non_cached_tokens
                 else "always" if t.decider == ALWAYS else "0 (never)")
        rows.append(f"| {path.name} | {prefill_layout.describe().split(';')[0]} | "
                    f"{decode_layout.describe().split(';')[0]} | {t.context_tokens:,} | "
                    f"{value} |")
    return rows


def test_the_documented_thresholds_are_the_models():
    text = (REPO / "docs" / "performance.md").read_text()
    table = text.split("<!-- decider-thresholds -->\n", 1)[1].split(
        "<!-- /decider-thresholds -->", 1)[0].splitlines()[2:]
    assert table == thresholds_table(), "docs/performance.md, the examples' thresholds; " \
        "the model gives:\n" + "\n".join(thresholds_table())
