"""Hostile input on the real kube-apiserver: every case is refused at apply with a message
naming its field, or refused by the planner with a condition while the running
StatefulSets keep their generation. docs/reliability.md's table is generated from CASES
(tests/cluster/reliability_doc.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from longctx_core.api import spec as api
from tests.conftest import example_cr, wait_for
from tests.core import test_rules

pytestmark = pytest.mark.cluster

APPLY, PLANNER = "apply", "planner"
Edit = Callable[[dict], None]


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    edit: Edit             # of the whole CR manifest
    field: str             # what the refusal must name
    stage: str = APPLY     # APPLY: the API server; PLANNER: a condition, nothing rolls
    condition: str = ""    # PLANNER: the condition set False

    def cr(self, name: str = "hostile") -> dict:
        cr = example_cr(name)
        self.edit(cr)
        return cr


def spec(path: str, value: Any) -> Edit:
    def edit(cr: dict) -> None:
        node = cr["spec"]
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return edit


def meta_name(value: str) -> Edit:
    return lambda cr: cr["metadata"].update(name=value)


def extra(*items: str, role: str = "decode") -> Edit:
    return spec(f"engine.extraArgs.{role}", list(items))


def seed(edit: Edit) -> Edit:
    """A rule table case's edit of the spec, on the seed's decode pools (as
    tests/core/test_rules.py builds its specs)."""
    def whole(cr: dict) -> None:
        cr["spec"]["decode"]["hiSparse"]["hostPoolPerRank"] = "48Gi"
        cr["spec"]["decode"]["cpuOffloadPerRank"] = "16Gi"
        edit(cr["spec"])
    return whole


def nested(depth: int) -> dict:
    value: dict = {"leaf": True}
    for _ in range(depth):
        value = {"nested": value}
    return value


NAMES = "names and lengths"
QUANTITIES = "quantity fields: negative, absurd, malformed"
UNICODE = "unicode and control characters"
INJECTION = "argv injection (extraArgs, model names)"
HUGE = "huge or deeply nested values"
DUPLICATES = "duplicate flags"
CROSS = "cross-field rules (the API's rule table)"
QUANTITY_FIELDS = ("prefill.cpuOffloadPerRank", "decode.cpuOffloadPerRank",
                   "decode.hiSparse.hostPoolPerRank", "capacity.gpuMemory",
                   "capacity.activationReservePerGpu", "capacity.kvBudgetPerGpu")

CASES: list[Case] = [
    # -- names and lengths
    Case("name-too-long", NAMES, meta_name("n" * (api.MAX_NAME_LENGTH + 1)), "metadata.name"),
    Case("name-uppercase", NAMES, meta_name("GLM"), "metadata.name"),
    Case("name-with-dots-and-underscore", NAMES, meta_name("glm_5.3"), "metadata.name"),
    Case("model-name-over-253", NAMES, spec("model.name", "m" * 254), "spec.model.name"),
    Case("served-name-over-253", NAMES, spec("model.servedName", "s" * 254),
         "spec.model.servedName"),
    Case("claim-name-over-253", NAMES, spec("model.source.pvc.claimName", "c" * 254),
         "spec.model.source.pvc.claimName"),
    Case("token-secret-name-over-253", NAMES, spec("model.source", {
        "huggingFace": {"tokenSecretRef": {"name": "s" * 254}}}),
         "spec.model.source.huggingFace.tokenSecretRef.name"),
    Case("image-over-512", NAMES, spec("engine.image", "ghcr.io/" + "a" * 510),
         "spec.engine.image"),
    Case("gpu-product-over-63", NAMES, spec("placement.gpuProduct", "H" * 64),
         "spec.placement.gpuProduct"),
    # -- quantities: negative and malformed at apply, absurd by the planner
    *[Case(f"negative-{f.replace('.', '-')}", QUANTITIES, spec(f, "-1Gi"), f"spec.{f}")
      for f in QUANTITY_FIELDS],
    Case("malformed-offload-words", QUANTITIES, spec("decode.cpuOffloadPerRank", "16 gigs"),
         "spec.decode.cpuOffloadPerRank"),
    Case("malformed-pool-GB-suffix", QUANTITIES,
         spec("decode.hiSparse.hostPoolPerRank", "48GB"), "spec.decode.hiSparse.hostPoolPerRank"),
    Case("malformed-gpu-memory-unknown-suffix", QUANTITIES, spec("capacity.gpuMemory", "140Qi"),
         "spec.capacity.gpuMemory"),
    Case("malformed-budget-two-dots", QUANTITIES, spec("capacity.kvBudgetPerGpu", "1.5.3Gi"),
         "spec.capacity.kvBudgetPerGpu"),
    Case("max-context-above-16M", QUANTITIES, spec("maxContextTokens", 2**31),
         "spec.maxContextTokens"),
    Case("max-context-zero", QUANTITIES, spec("maxContextTokens", 0), "spec.maxContextTokens"),
    Case("replicas-1000", QUANTITIES, spec("decode.replicas", 1000), "spec.decode.replicas"),
    Case("replicas-negative", QUANTITIES, spec("prefill.replicas", -1), "spec.prefill.replicas"),
    Case("side-channel-port-70000", QUANTITIES, spec("kvTransfer.sideChannelPort", 70000),
         "spec.kvTransfer.sideChannelPort"),
    Case("ready-timeout-zero", QUANTITIES, spec("engine.engineReadyTimeoutSeconds", 0),
         "spec.engine.engineReadyTimeoutSeconds"),
    Case("utilization-101", QUANTITIES, spec("capacity.gpuMemoryUtilizationPercent", 101),
         "spec.capacity.gpuMemoryUtilizationPercent"),
    Case("replicas-a-string", QUANTITIES, spec("decode.replicas", "two"), "spec.decode.replicas"),
    Case("absurd-prefill-offload-1Ei", QUANTITIES, spec("prefill.cpuOffloadPerRank", "1Ei"),
         "spec.prefill.cpuOffloadPerRank", PLANNER, "CapacityPlanned"),
    Case("absurd-decode-offload-300Gi-x8", QUANTITIES, spec("decode.cpuOffloadPerRank", "300Gi"),
         "spec.decode.cpuOffloadPerRank", PLANNER, "CapacityPlanned"),
    Case("absurd-hisparse-pool-1Pi", QUANTITIES, spec("decode.hiSparse.hostPoolPerRank", "1Pi"),
         "spec.decode.hiSparse.hostPoolPerRank", PLANNER, "CapacityPlanned"),
    Case("absurd-gpu-memory-1Ei", QUANTITIES, spec("capacity.gpuMemory", "1Ei"),
         "spec.capacity.gpuMemory", PLANNER, "CapacityPlanned"),
    Case("absurd-activation-reserve-1Ti", QUANTITIES,
         spec("capacity.activationReservePerGpu", "1Ti"), "spec.capacity.activationReservePerGpu",
         PLANNER, "CapacityPlanned"),
    Case("absurd-kv-budget-1Ti", QUANTITIES, spec("capacity.kvBudgetPerGpu", "1Ti"),
         "spec.capacity.kvBudgetPerGpu", PLANNER, "CapacityPlanned"),
    # -- unicode and control characters
    Case("image-with-unicode", UNICODE, spec("engine.image", "ghcr.io/longctx/éngine:0.1.0"),
         "spec.engine.image"),
    Case("image-with-newline", UNICODE, spec("engine.image", "ghcr.io/longctx/engine:0.1.0\n"),
         "spec.engine.image"),
    Case("picker-image-zero-width-space", UNICODE,
         spec("router.pickerImage", "ghcr.io/llm-d/epp\u200b:v0.10.0"), "spec.router.pickerImage"),
    Case("served-name-with-bell", UNICODE, spec("model.servedName", "glm\x07"),
         "spec.model.servedName"),
    Case("model-name-right-to-left-override", UNICODE,
         spec("model.name", "zai-org/\u202eGLM"), "spec.model.name"),
    Case("vllm-version-trailing-newline", UNICODE, spec("engine.vllmVersion", "0.33.0\n"),
         "spec.engine.vllmVersion"),
    Case("extra-arg-with-nul", UNICODE, extra("--max-num-seqs", "4\x00"),
         "spec.engine.extraArgs.decode[1]", PLANNER, "Accepted"),
    # -- argv injection
    Case("model-name-is-a-flag", INJECTION, spec("model.name", "--trust-remote-code"),
         "spec.model.name"),
    Case("model-name-with-a-flag", INJECTION, spec("model.name", "glm --trust-remote-code"),
         "spec.model.name"),
    Case("served-name-is-a-flag", INJECTION, spec("model.servedName", "-x"),
         "spec.model.servedName"),
    Case("extra-args-set-the-port", INJECTION, extra("--port", "1"),
         "spec.engine.extraArgs.decode[0]", PLANNER, "Accepted"),
    Case("extra-args-replace-the-model", INJECTION, extra("--model=evil/model", role="prefill"),
         "spec.engine.extraArgs.prefill[0]", PLANNER, "Accepted"),
    Case("extra-args-replace-kv-transfer", INJECTION,
         extra('--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_both"}'),
         "spec.engine.extraArgs.decode[0]", PLANNER, "Accepted"),
    Case("extra-args-shell-in-one-item", INJECTION, extra("--max-num-seqs 4; rm -rf /"),
         "spec.engine.extraArgs.decode[0]", PLANNER, "Accepted"),
    # -- huge or deeply nested values
    Case("extra-args-65-items", HUGE, extra(*["--enforce-eager"] * 65),
         "spec.engine.extraArgs.decode"),
    Case("priority-class-100k", HUGE, spec("placement.priorityClassName", "p" * 100_000),
         "spec.placement.priorityClassName"),
    Case("toleration-nested-50-deep", HUGE, spec("placement.tolerations", [nested(50)]),
         "spec.placement.tolerations[0]", PLANNER, "Accepted"),
    Case("toleration-not-a-toleration", HUGE, spec("placement.tolerations", [{"key": 5}]),
         "spec.placement.tolerations[0]", PLANNER, "Accepted"),
    # -- duplicate flags
    Case("duplicate-flag", DUPLICATES, extra("--max-num-seqs", "4", "--max-num-seqs", "8"),
         "spec.engine.extraArgs.decode[2]", PLANNER, "Accepted"),
    Case("flag-and-its-negation", DUPLICATES,
         extra("--enable-chunked-prefill", "--no-enable-chunked-prefill", role="prefill"),
         "spec.engine.extraArgs.prefill[1]", PLANNER, "Accepted"),
    # -- every cross-field rule of the API (the same cases as tests/core/test_rules.py)
    *[Case(f"rule-{case[0]}", CROSS, seed(case[1]), case[2]) for case in test_rules.CASES],
    Case("rule-kv-capacity", CROSS, spec("prefill.contextParallel", {"prefill": 8, "decode": 1}),
         "spec.prefill", PLANNER, "CapacityPlanned"),
]
APPLY_CASES = [c for c in CASES if c.stage == APPLY]
PLANNER_CASES = [c for c in CASES if c.stage == PLANNER]


RULE_CASES = {f"rule-{c[0]}": c for c in test_rules.CASES}


@pytest.mark.parametrize("case", APPLY_CASES, ids=[c.id for c in APPLY_CASES])
def test_refused_at_apply_naming_the_field(cluster, dry_run_namespace, case):
    proc = cluster.apply(case.cr(), dry_run_namespace, "--dry-run=server")
    assert proc.returncode != 0, f"{case.id}: the API server accepted it"
    assert case.field in proc.stderr, proc.stderr[:2000]
    if case.id in RULE_CASES:   # the rule's own message, as `longctx plan` gives it offline
        assert test_rules.expected_message(RULE_CASES[case.id]).partition(": ")[2] in \
            proc.stderr, proc.stderr[:2000]


def statefulsets(cluster, namespace: str, name: str) -> dict[str, tuple[int, str]]:
    """name -> (generation, resourceVersion) of the CR's StatefulSets."""
    return {s["metadata"]["name"]: (s["metadata"]["generation"],
                                    s["metadata"]["resourceVersion"])
            for s in cluster.list("statefulsets", namespace, f"app.kubernetes.io/instance={name}")}


def refused(cluster, namespace: str, name: str, case: Case) -> dict | None:
    cr = cluster.get("lcd", name, namespace) or {}
    status = cr.get("status") or {}
    if status.get("observedGeneration") != cr.get("metadata", {}).get("generation"):
        return None
    return next((c for c in status.get("conditions", []) if c["type"] == case.condition
                 and c["status"] == "False"), None)


def test_refused_by_the_planner_while_nothing_running_changes(cluster, operator, namespace):
    """One Ready deployment; each case applied over it in turn, then the good spec again."""
    good = example_cr("hostile")
    assert cluster.apply(good, namespace).returncode == 0
    wait_for(lambda: phase(cluster, namespace) == "Ready", 120, "hostile Ready")
    before = statefulsets(cluster, namespace, "hostile")
    assert len(before) == 2, before
    for case in PLANNER_CASES:
        assert cluster.apply(case.cr(), namespace).returncode == 0, case.id
        cond = wait_for(lambda: refused(cluster, namespace, "hostile", case), 30,
                        f"{case.id}: {case.condition}=False")
        assert case.field in cond["message"], (case.id, cond["message"])
        assert statefulsets(cluster, namespace, "hostile") == before, f"{case.id} rolled out"
    assert cluster.apply(copy.deepcopy(good), namespace).returncode == 0
    wait_for(lambda: phase(cluster, namespace) == "Ready", 60, "Ready again after the good spec")


def phase(cluster, namespace: str, name: str = "hostile") -> str | None:
    cr = cluster.get("lcd", name, namespace) or {}
    status = cr.get("status") or {}
    if status.get("observedGeneration") != cr.get("metadata", {}).get("generation"):
        return None
    return status.get("phase")
