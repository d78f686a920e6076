"""The spec's plan is computed once for equal inputs (desire.SpecPlans): a reconcile after
a child's status change reuses it, an edit of the spec or of the nodes' memory plans again,
and a reused plan is the one a fresh planning gives."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from longctx_core.sizing.host_memory import NodeMemory
from longctx_operator.controller import desire
from longctx_operator.controller.desire import SpecPlans, plan_spec

REPO = Path(__file__).resolve().parents[2]


def cr() -> dict:
    doc = yaml.safe_load((REPO / "examples" / "glm-5.3-1m.yaml").read_text())
    doc["metadata"] = {"name": "glm", "namespace": "ml", "uid": "u", "generation": 1}
    return doc


def counted(monkeypatch) -> list[int]:
    calls = [0]
    real = desire.plan_spec

    def plan(*args):
        calls[0] += 1
        return real(*args)
    monkeypatch.setattr(desire, "plan_spec", plan)
    return calls


def test_equal_inputs_reuse_the_plan_and_it_equals_a_fresh_one(monkeypatch):
    calls = counted(monkeypatch)
    plans, doc = SpecPlans(), cr()
    first = plans.of(doc, None)
    again = plans.of(copy.deepcopy(doc), None)
    assert calls[0] == 1 and again is first
    fresh = plan_spec(cr(), None)
    assert (again.spec, again.plan, again.plan_json, again.refusal) == \
        (fresh.spec, fresh.plan, fresh.plan_json, fresh.refusal)
    assert type(again.router) is type(fresh.router)
    assert first.plan is not None and first.refusal is None


def test_an_edit_of_the_spec_plans_again_and_the_last_inputs_are_not_shared(monkeypatch):
    calls = counted(monkeypatch)
    plans, doc = SpecPlans(), cr()
    first = plans.of(doc, None)
    doc["spec"]["decode"]["replicas"] = 3   # the caller's dict, edited after it was planned
    edited = plans.of(doc, None)
    assert calls[0] == 2 and edited.plan.decode.replicas == 3
    assert first.plan.decode.replicas != 3


def test_other_nodes_plan_again_and_a_forgotten_cr_is_planned_afresh(monkeypatch):
    calls = counted(monkeypatch)
    plans, doc = SpecPlans(), cr()
    plans.of(doc, None)
    nodes = [NodeMemory.from_manifest({"metadata": {"name": "n"}, "status": {
        "allocatable": {"memory": "2Ti", "cpu": "64"}}})]
    plans.of(doc, nodes)
    plans.of(doc, nodes)
    assert calls[0] == 2
    plans.forget(("ml", "glm"))
    plans.of(doc, nodes)
    assert calls[0] == 3
