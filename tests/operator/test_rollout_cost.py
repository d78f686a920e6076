"""What a change will do, said before it starts (controller/rollout_cost.py): which roles
roll and how, the GPUs at the peak and prefill's warm prefixes lost; offline through
`longctx plan --from`, and docs/operator.md shows that output, generated."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from longctx_core.api.spec import load_spec
from longctx_core.api.schema import SpecError
from longctx_core.plan.revision import pairing_changes, pairing_fields
from longctx_operator.controller.rollout_cost import BESIDE, IN_PLACE, KEEPS, RESTART
from tests import rollout_doc

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "glm-5.3-1m.yaml").read_text())
DECODE, PREFILL, IMAGE = (edit for _, _, edit in rollout_doc.EDITS)


def cost(edit: dict, **base: dict) -> dict:
    """`longctx plan --from` as JSON, for `edit` over the example with `base` merged in."""
    return json.loads(rollout_doc.plan_from(edit, base, "json"))


def test_a_decode_only_edit_rolls_decode_beside_and_prefill_keeps_its_prefixes():
    got = cost(DECODE)
    assert got["roles"] == {"prefill": KEEPS, "decode": BESIDE}
    assert (got["runningGPUs"], got["peakGPUs"], got["lostPrefixTokens"]) == (16, 24, 0)
    assert not got["newPairingKey"]


def test_a_prefill_only_edit_loses_prefills_cpu_tier_from_the_plan():
    from longctx_core.sizing.planner import plan
    got = cost(PREFILL)
    assert got["roles"] == {"prefill": BESIDE, "decode": KEEPS}
    tier = plan(load_spec(EXAMPLE["spec"])).to_json()["prefill"]["cpuOffloadTokens"]
    assert got["lostPrefixTokens"] == tier > 0 and got["peakGPUs"] == 24


def test_a_pairing_key_edit_rolls_both_and_under_recreate_restarts_them():
    got = cost(IMAGE)
    assert got["newPairingKey"] and got["roles"] == dict.fromkeys(("prefill", "decode"), BESIDE)
    assert got["peakGPUs"] == 32
    recreate = cost(IMAGE, rollout={"strategy": "Recreate"})
    assert recreate["roles"] == dict.fromkeys(("prefill", "decode"), RESTART)
    assert recreate["peakGPUs"] == 16


def test_roles_of_two_pods_roll_in_place_within_their_gpus():
    got = cost(DECODE, prefill={"replicas": 2}, decode={"replicas": 2})
    assert got["roles"] == {"prefill": KEEPS, "decode": IN_PLACE}
    assert got["peakGPUs"] == got["runningGPUs"] == 32


def test_the_pairing_key_fields_come_from_the_key_function():
    fields = pairing_fields()
    assert {"spec.model.name", "spec.engine.kvCacheDtype", "spec.engine.image"} <= set(fields)
    before = load_spec(EXAMPLE["spec"])
    after = load_spec(rollout_doc._merged(EXAMPLE["spec"], IMAGE))
    assert pairing_changes(before, after) == ["spec.engine.image"]
    assert pairing_changes(before, load_spec(rollout_doc._merged(EXAMPLE["spec"], DECODE))) == []


def test_from_must_name_the_same_deployment(tmp_path):
    from longctx_operator.cli import _rollout
    other = copy.deepcopy(EXAMPLE)
    other["metadata"]["name"] = "other"
    with pytest.raises(SpecError, match="metadata.name"):
        _rollout(other, copy.deepcopy(EXAMPLE), "table")


def test_the_documented_plan_outputs_are_the_clis():
    current = rollout_doc.DOC.read_text()
    assert current == rollout_doc.render(current), (
        "docs/operator.md's `longctx plan --from` examples are stale: run "
        "`python -m tests.rollout_doc --write` (make figures)")
