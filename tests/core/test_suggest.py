"""`longctx plan --suggest`: the smallest layout of each role the planner proves fits, on the
given GPUs per node and host memory."""

from __future__ import annotations

import json

import pytest

from longctx_core.plan import suggest
from longctx_core.quantity import GiB
from longctx_core.plan.rules import problems
from longctx_operator import cli
from tests.core.planner_support import EXAMPLE, spec_with


@pytest.mark.parametrize("gpus, memory", [(8, None), (8, 2048 * GiB), (16, 2048 * GiB)])
def test_the_suggestion_fits_and_no_smaller_pod_would(gpus, memory):
    spec = spec_with(decode={"hiSparse": {"hostPoolPerRank": "auto"}})
    found = suggest.suggest(spec, gpus, memory)
    assert found.plan.fits, found.plan.refusal
    assert not problems(found.spec)
    nodes = suggest.nodes_of(spec, memory)
    for role, chosen in found.changes.items():
        smaller = [f for f in suggest._layouts(role, gpus, True)
                   if f["gpusPerPod"] < chosen["gpusPerPod"]]
        assert smaller, "GLM-5.3's weights need a whole 8-GPU pod: the test must try less"
        for fields in smaller:
            candidate = suggest._with(spec, role, fields)
            if not problems(candidate):
                assert not suggest._role_fits(suggest.plan(candidate, nodes), role), fields


def test_the_seed_layout_is_kept_when_nothing_smaller_or_larger_holds_more():
    found = suggest.suggest(spec_with(), 8)
    assert found.changes["prefill"]["contextParallel"] == {"prefill": 8, "decode": 8}
    assert found.changes["decode"]["dataParallel"] == 8


def test_node_memory_bounds_the_pods():
    memory = 2048 * GiB
    found = suggest.suggest(spec_with(), 8, memory)
    assert found.plan.host_memory["checked"]
    assert found.plan.host_memory["prefillPodGiB"] <= memory / GiB
    with pytest.raises(ValueError, match="no spec.prefill layout of up to 8 GPUs per node"):
        suggest.suggest(spec_with(), 8, 64 * GiB)


def test_too_few_gpus_per_node_is_refused_with_the_planners_reason():
    with pytest.raises(ValueError, match="up to 4 GPUs per node holds 1048576 tokens.*KV per GPU"):
        suggest.suggest(spec_with(), 4)


def test_cli_prints_the_fields_to_set(capsys):
    rc = cli.main(["plan", "-f", str(EXAMPLE), "--suggest", "--node-memory", "2Ti", "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["fits"]
    assert set(out["suggestion"]) == {"prefill", "decode"}
    assert out["suggestion"]["decode"]["gpusPerPod"] == 8
    assert cli.main(["plan", "-f", str(EXAMPLE), "--suggest", "--gpus-per-node", "4"]) == 3
    assert "error: no spec.prefill layout" in capsys.readouterr().err
