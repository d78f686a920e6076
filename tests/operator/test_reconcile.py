"""The reconcile's P/D pairing check, which can fail (it pairs plans of two specs), and the
order it writes children in."""

from __future__ import annotations

import pytest

from longctx_core import contract
from longctx_core.plan.revision import pairing_key
from longctx_core.plan.roles import serving_plan
from longctx_core.plan.rules import RecipeError
from longctx_core.vllm_config.recipes import launch_document
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.desired import desired_objects
from longctx_operator.controller.engine_documents import check_pair
from longctx_operator import kinds
from tests.contract.variants import spec_with


def _set_engine(**fields):
    return lambda d: d.setdefault("engine", {}).update(**fields)


@pytest.mark.parametrize("edit, mismatch", [
    (_set_engine(vllmVersion="0.34.0"), "vLLM version"),
    (_set_engine(extraArgs={"decode": ["--attention-backend", "FLASHMLA_SPARSE"]}),
     "--attention-backend"),
    (_set_engine(speculative={"method": "none"}), "speculative decoding is"),
])
def test_a_pair_across_specs_that_nixl_would_refuse_is_refused(edit, mismatch):
    old, new = serving_plan(spec_with()), serving_plan(spec_with(edit))
    with pytest.raises(RecipeError, match=mismatch):
        check_pair(launch_document(old.prefill, "glm", "ns"),
                   launch_document(new.decode, "glm", "ns"))
    check_pair(launch_document(old.prefill, "glm", "ns"), launch_document(old.decode, "glm", "ns"))


@pytest.mark.parametrize("edit", [
    _set_engine(vllmVersion="0.34.0"),
    _set_engine(image="ghcr.io/longctx/engine:0.2.0"),
    _set_engine(extraArgs={"decode": ["--attention-backend", "FLASHMLA_SPARSE"]}),
    _set_engine(extraArgs={"decode": ["--block-size", "128"]}),
    _set_engine(speculative={"method": "none"}),
])
def test_every_handshake_factor_changes_the_revision(edit):
    """So an in-place roll (same revision) can never pair engines NIXL would refuse: each
    factor pd_compatibility compares and a spec edit can change is in the pairing key."""
    assert pairing_key(spec_with(edit)) != pairing_key(spec_with())


def test_an_edit_outside_the_handshake_keeps_the_revision():
    edit = _set_engine(extraArgs={"decode": ["--max-num-seqs", "32"]})
    assert pairing_key(spec_with(edit)) == pairing_key(spec_with())


def _references(obj: dict) -> list[tuple[str, str]]:
    """The (kind, name) of the children an object names: what its pods mount and run as,
    and a RoleBinding's Role and subjects."""
    refs = []
    pod = obj.get("spec", {}).get("template", {}).get("spec")
    if pod is not None:
        if pod.get("serviceAccountName"):
            refs.append(("ServiceAccount", pod["serviceAccountName"]))
        refs += [("ConfigMap", v["configMap"]["name"]) for v in pod.get("volumes", [])
                 if "configMap" in v]
    if obj["kind"] == "RoleBinding":
        refs.append((obj["roleRef"]["kind"], obj["roleRef"]["name"]))
        refs += [(s["kind"], s["name"]) for s in obj["subjects"]]
    return refs


def test_every_child_is_written_in_a_wave_after_the_children_it_names():
    cr = {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
          "metadata": {"name": "glm", "namespace": "llm", "uid": "u-1"}}
    plan = serving_plan(spec_with())
    objects = desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=True)
    wave = {(o["kind"], o["metadata"]["name"]): kinds.KIND_BY_NAME[o["kind"]].wave
            for o in objects}
    checked = 0
    for obj in objects:
        for ref in _references(obj):
            assert ref in wave, f"{obj['kind']}/{obj['metadata']['name']} names {ref}"
            assert wave[ref] < wave[obj["kind"], obj["metadata"]["name"]], (obj["kind"], ref)
            checked += 1
    assert checked >= 5   # the engine config, the picker's config and account, the binding
