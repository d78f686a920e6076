"""P/D units: where each role's pod count comes from, and what /scale reports."""

from __future__ import annotations

from longctx_core.sizing import scaling
from longctx_core.sizing.layout import role_layout
from longctx_core.plan.roles import serving_plan
from tests.contract.variants import spec_with


def _units(replicas: int | None, prefill: int = 1, decode: int = 1, roles: bool = False):
    def edit(d: dict) -> None:
        for role in ("prefill", "decode"):
            if not roles:
                d[role].pop("replicas", None)
        if replicas is not None:
            d["replicas"] = replicas
        d["scaling"] = {"prefillPerUnit": prefill, "decodePerUnit": decode}
    return spec_with(edit)


def _pod(role: str, i: int, **extra) -> dict:
    return {"metadata": {"name": f"glm-{role}-{i}", "labels": {
        "app.kubernetes.io/component": role}, **extra}, "status": {"phase": "Running"}}


def test_units_times_the_ratio_give_each_roles_pods_in_the_layout():
    spec = _units(3, prefill=1, decode=2)
    assert [role_layout(spec, r).replicas for r in ("prefill", "decode")] == [3, 6]
    plan = serving_plan(spec)
    assert (plan.prefill.replicas, plan.decode.replicas) == (3, 6)
    assert scaling.units(spec) == 3


def test_spec_replicas_wins_over_the_per_role_fields():
    spec = _units(2, roles=True)   # the example's explicit prefill/decode replicas: 1
    assert spec.prefill.replicas == 1
    assert role_layout(spec, "prefill").replicas == 2


def test_without_spec_replicas_the_per_role_fields_apply_else_one_unit():
    assert role_layout(_units(None, decode=2), "decode").replicas == 2
    explicit = _units(None, roles=True)
    assert role_layout(explicit, "decode").replicas == explicit.decode.replicas == 1
    assert scaling.units(_units(None, decode=2)) == 1


def test_zero_units_scale_both_roles_to_zero():
    spec = _units(0)
    assert [role_layout(spec, r).replicas for r in ("prefill", "decode")] == [0, 0]


def test_observed_units_count_complete_units_of_live_pods():
    spec = _units(2, prefill=1, decode=2)
    pods = [_pod("prefill", 0), _pod("prefill", 1), _pod("decode", 0), _pod("decode", 1),
            _pod("decode", 2)]
    assert scaling.observed_units(spec, pods) == 1          # 3 decode pods: 1 whole unit
    pods.append(_pod("decode", 3))
    assert scaling.observed_units(spec, pods) == 2
    pods[-1]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert scaling.observed_units(spec, pods) == 1


def test_observed_units_never_exceed_the_units_asked_for():
    spec = _units(1)
    pods = [_pod(r, i) for r in ("prefill", "decode") for i in range(2)]  # two revisions
    assert scaling.observed_units(spec, pods) == 1


def test_scale_status_carries_replicas_and_the_serving_selector():
    status = scaling.scale_status("glm", _units(1), [_pod("prefill", 0), _pod("decode", 0)])
    assert status == {"replicas": 1, "selector":
                      "app.kubernetes.io/instance=glm,llm-d.ai/inference-serving=true"}
    assert scaling.scale_status("glm", None, [])["replicas"] == 0
