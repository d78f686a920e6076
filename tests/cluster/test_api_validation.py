"""The API server enforces every schema and CEL rule at `kubectl apply` with the
rule's own message; the planner refuses what only it can judge, without touching what runs."""

from __future__ import annotations

import copy
import json

import pytest

from longctx_core.api import spec as api
from longctx_core.plan import rules
from tests.cluster.test_reconcile import condition, wait_ready
from tests.core.test_rules import CASES, expected_message
from tests.conftest import example_cr, sts_name, wait_for

pytestmark = pytest.mark.cluster


def set_path(cr: dict, path: str, value) -> None:
    node = cr["spec"]
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


def seed_cr(name: str, edit) -> dict:
    """The example CR with the seed's decode pools and one case's edit, as
    tests.core.test_rules builds its spec."""
    cr = example_cr(name)
    cr["spec"]["decode"]["hiSparse"]["hostPoolPerRank"] = "48Gi"
    cr["spec"]["decode"]["cpuOffloadPerRank"] = "16Gi"
    edit(cr["spec"])
    return cr


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_rule_rejects_its_bad_case_with_the_offline_message(cluster, dry_run_namespace,
                                                                 case):
    """The same rule, the same case, the same words as `longctx plan` offline."""
    proc = cluster.apply(seed_cr("bad", case[1]), dry_run_namespace, "--dry-run=server")
    assert proc.returncode != 0, "the API server accepted an invalid spec"
    path, _, message = expected_message(case).partition(": ")
    assert f"{path}: Invalid value" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_schema_rejects_a_malformed_quantity(cluster, dry_run_namespace):
    cr = example_cr("bad")
    set_path(cr, "decode.cpuOffloadPerRank", "16 gigs")
    proc = cluster.apply(cr, dry_run_namespace, "--dry-run=server")
    assert proc.returncode != 0 and "spec.decode.cpuOffloadPerRank" in proc.stderr, proc.stderr


def test_name_rule_rejects_a_long_name_with_the_offline_message(cluster, dry_run_namespace):
    name = "n" * (api.MAX_NAME_LENGTH + 1)
    proc = cluster.apply(example_cr(name), dry_run_namespace, "--dry-run=server")
    assert proc.returncode != 0
    assert rules.name_problem(name) in proc.stderr, proc.stderr
    assert cluster.get("lcd", "bad", dry_run_namespace) is None


def test_the_example_itself_is_accepted(cluster, dry_run_namespace):
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", dry_run_namespace, "-f",
                           "examples/glm-5.3-1m.yaml")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path, value", [("model.name", "other/model"),
                                         ("engine.kvCacheDtype", "fp8_ds_mla"),
                                         ("engine.speculative.method", "none")])
def test_fields_the_nixl_handshake_depends_on_can_be_edited(cluster, namespace, path, value):
    """A new revision, not a new CR: the API server accepts the edit (a revisioned rollout,
    tests/operator/test_revision_edits.py)."""
    cr = example_cr("edit")
    assert cluster.apply(cr, namespace).returncode == 0
    changed = copy.deepcopy(cr)
    set_path(changed, path, value)
    proc = cluster.apply(changed, namespace)
    assert proc.returncode == 0, proc.stderr


def test_planner_refusal_rolls_out_nothing_and_correction_recovers(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)
    before = {role: cluster.get("statefulset", sts_name(example_cr(), role), namespace)["metadata"]
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
        meta = cluster.get("statefulset", sts_name(example_cr(), role), namespace)["metadata"]
        assert (meta["generation"], meta["resourceVersion"]) == (
            before[role]["generation"], before[role]["resourceVersion"]), f"{role} was touched"
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    assert any(e["reason"] == "SpecRefused" and e["type"] == "Warning" for e in events["items"])

    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_for(lambda: (condition(cluster, namespace, "glm", "CapacityPlanned") or {}).get(
        "status") == "True", 30, "CapacityPlanned=True again")
    wait_ready(cluster, namespace)
