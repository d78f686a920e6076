"""Issue 3: the API server enforces every schema and CEL rule at `kubectl apply` with the
rule's own message; the planner refuses what only it can judge, without touching what runs."""

from __future__ import annotations

import copy
import json

import pytest

from longctx_engine import api
from tests.cluster.test_reconcile import condition, wait_ready
from tests.conftest import example_cr, wait_for

pytestmark = pytest.mark.cluster


def set_path(cr: dict, path: str, value) -> None:
    node = cr["spec"]
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


# (what is set, the words of the rule's message that must reach the user)
BAD = [
    ({"model.source": {"pvc": {"claimName": "m"}, "huggingFace": {}}},
     "set exactly one of spec.model.source.pvc and spec.model.source.huggingFace"),
    ({"model.architecture": {"layers": 4, "attentionHeads": 8, "kvLoraRank": 512,
                             "qkRopeHeadDim": 64}},
     "set exactly one of spec.model.preset"),
    ({"engine.speculative": {"method": "mtp", "draftTokens": 0}},
     "draftTokens must be at least 1"),
    ({"prefill.contextParallel": {"prefill": 8, "decode": 8, "commBackend": "a2a"}},
     "commBackend must be ag_rs"),
    ({"prefill.contextParallel": {"prefill": 8, "decode": 4}},
     "decode context parallelism must equal prefill context parallelism"),
    ({"prefill.contextParallel": {"prefill": 3, "decode": 1}}, "prefill must be a power of two"),
    ({"decode.pipelineParallel": 3, "decode.hiSparse": {"enabled": False}},
     "must divide gpusPerPod"),
    ({"decode.dataParallel": 4}, "dataParallel must be a multiple of the ranks one pod holds"),
    ({"decode.contextParallel": {"prefill": 1, "decode": 2}, "decode.hiSparse": {"enabled": False}},
     "must not exceed tensorParallel x contextParallel.prefill"),
    ({"decode.contextParallel": {"prefill": 2, "decode": 2}},
     "HiSparse cannot run with decode context parallelism"),
    ({"decode.pipelineParallel": 2}, "HiSparse cannot run with pipeline parallelism"),
    ({"prefill.tensorParallel": 2}, "spec.prefill.tensorParallel must be 1"),
    ({"decode.cpuOffloadPerRank": "16 gigs"}, "spec.decode.cpuOffloadPerRank"),
]


@pytest.mark.parametrize("changes, message", BAD, ids=[m[:40] for _, m in BAD])
def test_each_rule_rejects_its_bad_case_with_its_message(cluster, namespace, changes, message):
    cr = example_cr("bad")
    for path, value in changes.items():
        set_path(cr, path, value)
    proc = cluster.apply(cr, namespace)
    assert proc.returncode != 0, "the API server accepted an invalid spec"
    assert message in proc.stderr, proc.stderr
    assert cluster.get("lcd", "bad", namespace) is None


def test_the_example_itself_is_accepted(cluster, namespace):
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f",
                           "examples/glm-5.3-1m.yaml")
    assert proc.returncode == 0, proc.stderr


def test_names_too_long_for_derived_objects_are_rejected(cluster, namespace):
    cr = example_cr("x" * (api.MAX_NAME_LENGTH + 1))
    proc = cluster.apply(cr, namespace)
    assert proc.returncode != 0 and "at most" in proc.stderr and "63-character" in proc.stderr


@pytest.mark.parametrize("path, value", [("model.name", "other/model"),
                                         ("engine.kvCacheDtype", "auto")])
def test_fields_the_nixl_handshake_depends_on_are_immutable(cluster, namespace, path, value):
    cr = example_cr("imm")
    assert cluster.apply(cr, namespace).returncode == 0
    changed = copy.deepcopy(cr)
    set_path(changed, path, value)
    proc = cluster.apply(changed, namespace)
    assert proc.returncode != 0 and "immutable" in proc.stderr, proc.stderr
    assert "NIXL handshake" in proc.stderr


def test_planner_refusal_rolls_out_nothing_and_correction_recovers(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)
    before = {role: cluster.get("statefulset", f"glm-{role}", namespace)["metadata"]
              for role in ("prefill", "decode")}

    # PCP8 alone replicates the 1M-token KV on every GPU: it cannot fit.
    refused = example_cr()
    refused["spec"]["prefill"]["contextParallel"] = {"prefill": 8, "decode": 1}
    refused["spec"]["maxContextTokens"] = 1048576
    assert cluster.apply(refused, namespace).returncode == 0
    planned = wait_for(lambda: (c := condition(cluster, namespace, "glm", "CapacityPlanned"))
                       and c["status"] == "False" and c, 30, "CapacityPlanned=False")
    assert "contextParallel" in planned["message"], planned["message"]
    status = cluster.get("lcd", "glm", namespace)["status"]
    assert status["phase"] == "Refused"
    for role in ("prefill", "decode"):
        meta = cluster.get("statefulset", f"glm-{role}", namespace)["metadata"]
        assert (meta["generation"], meta["resourceVersion"]) == (
            before[role]["generation"], before[role]["resourceVersion"]), f"{role} was touched"
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    assert any(e["reason"] == "SpecRefused" and e["type"] == "Warning" for e in events["items"])

    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_for(lambda: (condition(cluster, namespace, "glm", "CapacityPlanned") or {}).get(
        "status") == "True", 30, "CapacityPlanned=True again")
    wait_ready(cluster, namespace)
