"""The rule table: every API rule has a bad case, refused offline with the message the API
server gives (tests/cluster/test_api_validation.py sends the same cases to a real one)."""

from __future__ import annotations

from typing import Callable

import celpy
import pytest

from longctx_core.api import spec as api
from longctx_core.plan import rules
from longctx_core.api.schema import Rule
from tests.contract.variants import seed_spec, spec_with


def _arch(mtp_layers: int) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        d["model"].pop("preset")
        d["model"]["architecture"] = {"layers": 78, "mtpLayers": mtp_layers,
                                      "attentionHeads": 64, "kvLoraRank": 512,
                                      "qkRopeHeadDim": 64}
    return edit


def _set(path: str, value) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        *parents, leaf = path.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = value
    return edit


def _both(*edits: Callable[[dict], None]) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        for e in edits:
            e(d)
    return edit


NO_HISPARSE = _set("decode.hiSparse.enabled", False)


def NO_ROLE_REPLICAS(d: dict) -> None:
    """Scaled in P/D units: no per-role replicas."""
    for role in ("prefill", "decode"):
        d[role].pop("replicas", None)


UNITS = _both(NO_ROLE_REPLICAS, _set("replicas", 1))

# (id, edit of the example spec, path of the rule, a phrase of the rule's message)
CASES = [
    ("auto-kv-with-dcp", _set("engine.kvCacheDtype", "auto"), "spec", "a bf16 cache"),
    ("mtp-without-layers", _arch(0), "spec", "has no MTP layers"),
    ("pcp-multi-module-mtp", _arch(2), "spec", "single-module MTP"),
    ("nine-ranks-per-pod", _both(_set("decode.gpusPerPod", 16), _set("decode.dataParallel", 16)),
     "spec", "InferencePool lists at most"),
    ("min-ready-above-replicas", _set("rollout.minReadyReplicas", 2), "spec",
     "rollout.minReadyReplicas"),
    ("preset-and-architecture", lambda d: d["model"].update(
        architecture={"layers": 1, "attentionHeads": 1, "kvLoraRank": 1, "qkRopeHeadDim": 0}),
     "spec.model", "set exactly one of spec.model.preset"),
    ("two-model-sources", _set("model.source.huggingFace", {}), "spec.model.source",
     "set exactly one of spec.model.source.pvc"),
    ("zero-draft-tokens", _set("engine.speculative.draftTokens", 0), "spec.engine.speculative",
     "draftTokens is"),
    ("prefill-gpus-not-power-of-two", _set("prefill.gpusPerPod", 6), "spec.prefill",
     "gpusPerPod is"),
    ("prefill-dp-not-power-of-two", _set("prefill.dataParallel", 3), "spec.prefill",
     "dataParallel is"),
    ("prefill-tp-not-power-of-two", _set("prefill.tensorParallel", 3), "spec.prefill",
     "tensorParallel is {self.tensorParallel}; it must be a power of two"),
    ("prefill-rank-larger-than-pod", _set("prefill.gpusPerPod", 4), "spec.prefill",
     "one engine rank takes"),
    ("prefill-dp-not-multiple-of-ranks",
     _both(_set("prefill.contextParallel", {"prefill": 4, "decode": 4}),
           _set("prefill.dataParallel", 1)), "spec.prefill",
     "must be a multiple of the ranks one pod holds"),
    ("prefill-replicas-not-multiple-of-group",
     _both(_set("prefill.dataParallel", 2), _set("prefill.gpusPerPod", 8),
           _set("prefill.replicas", 3)), "spec.prefill",
     "must be a multiple of the pods of one data-parallel group"),
    ("decode-gpus-not-power-of-two", _set("decode.gpusPerPod", 6), "spec.decode", "gpusPerPod is"),
    ("decode-dp-not-power-of-two", _set("decode.dataParallel", 12), "spec.decode",
     "dataParallel is"),
    ("decode-tp-not-power-of-two", _set("decode.tensorParallel", 3), "spec.decode",
     "tensorParallel is {self.tensorParallel}; it must be a power of two"),
    ("decode-rank-larger-than-pod", _set("decode.tensorParallel", 16), "spec.decode",
     "one engine rank takes"),
    ("decode-dp-not-multiple-of-ranks", _set("decode.dataParallel", 4), "spec.decode",
     "must be a multiple of the ranks one pod holds"),
    ("decode-replicas-not-multiple-of-group",
     _both(_set("decode.dataParallel", 16), _set("decode.replicas", 3)), "spec.decode",
     "must be a multiple of the pods of one data-parallel group"),
    ("prefill-dcp-not-transfer-size", _set("prefill.contextParallel",
                                           {"prefill": 8, "decode": 4}), "spec.prefill",
     "the NIXL transfer parallel size"),
    ("decode-dcp-not-transfer-size", _both(NO_HISPARSE, _set("decode.contextParallel",
                                                             {"decode": 4})),
     "spec.decode", "the NIXL transfer parallel size"),
    ("prefill-tensor-parallel", _set("prefill.tensorParallel", 2), "spec.prefill.tensorParallel",
     "context parallelism replaces it"),
    ("prefill-threads-bind", _set("engine.cpu.threadsBind.prefill", "cores 0"),
     "spec.engine.cpu.threadsBind.prefill", "a core list like 0-3,8"),
    ("decode-threads-bind", _set("engine.cpu.threadsBind.decode", "1-"),
     "spec.engine.cpu.threadsBind.decode", "a core list like 0-3,8"),
    ("prefill-pcp-not-power-of-two", _set("prefill.contextParallel", {"prefill": 3, "decode": 1}),
     "spec.prefill.contextParallel", "prefill is"),
    ("prefill-dcp-not-power-of-two", _set("prefill.contextParallel", {"prefill": 1, "decode": 3}),
     "spec.prefill.contextParallel", "decode is"),
    ("prefill-a2a", _set("prefill.contextParallel.commBackend", "a2a"),
     "spec.prefill.contextParallel", "rejects a2a"),
    ("prefill-dcp-not-pcp", _set("prefill.contextParallel", {"prefill": 8, "decode": 4}),
     "spec.prefill.contextParallel", "re-assembles the KV shards"),
    ("decode-pcp", _both(_set("decode.contextParallel", {"prefill": 2}),
                         _set("decode.dataParallel", 4)), "spec.decode",
     "only on the producer (prefill) side"),
    ("hisparse-with-dcp", _both(_set("decode.tensorParallel", 2), _set("decode.dataParallel", 4),
                                _set("decode.contextParallel", {"decode": 2})), "spec.decode",
     "HiSparse cannot run with decode context parallelism"),
    ("hisparse-with-pp", _both(_set("decode.pipelineParallel", 2), _set("decode.dataParallel", 4)),
     "spec.decode", "HiSparse cannot run with pipeline parallelism"),
    ("decode-pcp-not-power-of-two", _both(_set("decode.contextParallel", {"prefill": 3}),
                                          _set("decode.gpusPerPod", 3),
                                          _set("decode.dataParallel", 1)),
     "spec.decode.contextParallel", "prefill is"),
    ("decode-dcp-not-power-of-two", _both(NO_HISPARSE, _set("decode.contextParallel",
                                                            {"decode": 3})),
     "spec.decode.contextParallel", "decode is"),
    ("decode-a2a", _both(NO_HISPARSE, _set("decode.dataParallel", 4),
                         _set("decode.contextParallel",
                              {"prefill": 2, "decode": 2, "commBackend": "a2a"})),
     "spec.decode.contextParallel", "rejects a2a"),
    ("decode-dcp-not-pcp", _both(NO_HISPARSE, _set("decode.dataParallel", 4),
                                 _set("decode.contextParallel", {"prefill": 2, "decode": 4})),
     "spec.decode.contextParallel", "re-assembles the KV shards"),
    ("engine-image-not-a-reference", _set("engine.image", "ghcr.io/longctx/Engine 0.1"),
     "spec.engine.image", "is not an image reference"),
    ("picker-image-not-a-reference", _set("router.pickerImage", "epp;latest"),
     "spec.router.pickerImage", "is not an image reference"),
    ("sidecar-image-not-a-reference", _set("router.sidecarImage", "sidecar:v1\n"),
     "spec.router.sidecarImage", "is not an image reference"),
    ("vllm-router-image-not-a-reference", _set("router.vllmRouterImage", "Router:1"),
     "spec.router.vllmRouterImage", "is not an image reference"),
    ("endpoint-image-not-a-reference", _set("endpoint.image", "Operator image"),
     "spec.endpoint.image", "is not an image reference"),
    ("endpoint-router-url-with-vllm-router",
     _both(_set("router.type", "vllm-router"), _set("endpoint.routerURL", "http://gw:80")),
     "spec", "endpoint.routerURL"),
    ("model-name-read-as-a-flag", _set("model.name", "--trust-remote-code"),
     "spec.model.name", "is not one --model word"),
    ("served-name-with-a-space", _set("model.servedName", "glm 5"),
     "spec.model.servedName", "is not one --served-model-name word"),
    ("ratio-zero", _set("scaling", {"prefillPerUnit": 1, "decodePerUnit": 0}), "spec.scaling",
     "both must be at least 1"),
    ("min-units-above-max", _both(UNITS, _set("autoscaling", {"minUnits": 3, "maxUnits": 2})),
     "spec.autoscaling", "is more than maxUnits"),
    ("autoscaling-without-signal", _both(UNITS, _set("autoscaling", {
        "maxUnits": 2, "metrics": {"decodeCapacityPercent": 0}})), "spec.autoscaling.metrics",
     "the autoscaler has no signal"),
    ("autoscaling-beside-role-replicas", _both(_set("replicas", 1),
                                               _set("autoscaling", {"maxUnits": 2})),
     "spec", "autoscaling is set beside explicit"),
    ("autoscaling-without-units", _both(NO_ROLE_REPLICAS, _set("autoscaling", {"maxUnits": 2})),
     "spec", "autoscaling is set but replicas is not"),
    ("prefill-unit-not-whole-groups", _both(
        NO_ROLE_REPLICAS, _set("prefill.dataParallel", 2), _set("prefill.gpusPerPod", 8)),
     "spec", "scaling.prefillPerUnit ({self.scaling.prefillPerUnit}) must be"),
    ("decode-unit-not-whole-groups", _both(NO_ROLE_REPLICAS, _set("decode.dataParallel", 16)),
     "spec", "scaling.decodePerUnit ({self.scaling.decodePerUnit}) must be"),
]


def case_rule(path: str, phrase: str) -> Rule:
    (rule,) = [r for p, r in rules.table() if p == path and phrase in r.message]
    return rule


def expected_message(case) -> str:
    """The message the rule gives for the case's spec, as offline and the API server say it."""
    _, edit, path, phrase = case
    subject = rules._at(seed_spec(edit), path)
    return f"{path}: {case_rule(path, phrase).render(subject)}"


def test_every_rule_of_the_table_has_a_bad_case():
    covered = {(path, case_rule(path, phrase).message) for _, _, path, phrase in CASES}
    missing = [(p, r.message) for p, r in rules.table() if (p, r.message) not in covered]
    assert not missing, missing


def test_the_example_breaks_no_rule():
    assert rules.rule_violations(spec_with()) == []


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_bad_case_is_refused_offline_with_its_rule_message(case):
    _, edit, _, _ = case
    found = rules.problems(seed_spec(edit))
    assert expected_message(case) in found, found


def test_messages_name_the_value():
    msg = expected_message(next(c for c in CASES if c[0] == "prefill-a2a"))
    assert msg == ("spec.prefill.contextParallel: commBackend is a2a with prefill 8 and decode 8: "
                   "vLLM's Model Runner V2 rejects a2a when both context parallelisms are above "
                   "1; set commBackend to ag_rs")


def test_rules_are_evaluated_as_cel_on_the_manifest_form():
    """has() is false for an unset field, `/` is integer division, a map literal and `in`
    work, and an evaluation error (a missing key) fails the rule as on the API server."""
    rule = Rule("!has(self.x) || (self.n / 2 == 1 && self.s.size() <= 3 && self.n in [2, 3] "
                "&& {'a': 1}[self.s] == 1)", "n is {self.n}")
    assert rule.holds({"n": 2, "s": "abc"}) and rule.render({"n": 2}) == "n is 2"
    assert rule.holds({"x": 1, "n": 3, "s": "a"})
    assert not rule.holds({"x": 1, "n": 4, "s": "a"})
    assert not rule.holds({"x": 1, "n": 2, "s": "b"})
    assert rule.cel() == {"rule": rule.rule, "messageExpression": '"n is %s".format([self.n])'}


def test_a_rule_that_is_not_cel_fails_at_its_first_use():
    with pytest.raises(celpy.CELParseError):
        Rule("self.n ==", "").holds({"n": 1})


def test_name_rule_offline():
    assert rules.name_problem("glm") is None
    long = "x" * (api.MAX_NAME_LENGTH + 1)
    assert rules.name_problem(long).startswith(f"metadata.name {long} is longer than")
