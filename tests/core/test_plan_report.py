"""Table and JSON renderings of a capacity plan."""

from __future__ import annotations

import json

import pytest

from longctx_core.sizing import planner
from longctx_core.sizing.plan_report import render_json, render_table

from tests.core.planner_support import DP8_PREFILL, example_spec, spec_with


@pytest.fixture
def plan():
    return planner.plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": "51Gi"}}))


def test_render_json_is_the_plan(plan):
    assert json.loads(render_json(plan)) == plan.to_json()


def test_table_has_units_and_the_seed_figures(plan):
    table = render_table(plan)
    assert "FITS" in table.splitlines()[0]
    for text in ("54,728 B", "51,168 B", "2,772 B", "788 B", "53.45 GiB", "6.68 GiB",
                 "191.3 FLOP/B", "tokens", "Prefill", "Decode"):
        assert text in table, text


def test_table_rows_are_aligned(plan):
    lines = render_table(plan).splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("Prefill"))
    rule = lines[header + 1]
    columns = [i for i, ch in enumerate(rule) if ch == "-" and (i == 0 or rule[i - 1] == " ")]
    assert len(columns) == 3
    for line in lines[header + 2:]:
        if not line.strip():
            break
        # Every value starts at its column.
        for start in columns[1:]:
            assert line[start - 2:start] == "  " and line[start] != " ", line


@pytest.mark.parametrize("changes, field", [
    ({"prefill": DP8_PREFILL}, "spec.prefill.contextParallel.decode"),
    ({"decode": {"hiSparse": {"enabled": False}}}, "spec.decode.hiSparse.enabled"),
])
def test_table_of_a_refused_plan_says_what_to_change(changes, field):
    table = render_table(planner.plan(spec_with(**changes)))
    assert "REFUSED" in table.splitlines()[0]
    assert "Refused:" in table and "NO" in table
    assert field in " ".join(line.strip() for line in table.splitlines())


def test_table_marks_an_overridden_budget():
    table = render_table(planner.plan(spec_with(capacity={"kvBudgetPerGpu": "20Gi"})))
    assert "20.00 GiB (set)" in table


def test_explicit_architecture_is_named():
    raw = example_spec()
    preset = raw["model"].pop("preset")
    from longctx_core.sizing import models
    arch = models.PRESETS[preset]
    raw["model"]["architecture"] = {k: v for k, v in arch.__dict__.items() if v is not None}
    from longctx_core.api.spec import load_spec
    assert "explicit architecture" in render_table(planner.plan(load_spec(raw)))
