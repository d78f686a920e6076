"""Which revision a spec rolls to: a role's only pod is replaced beside the serving one,
never restarted in place, when its template changes or its node is drained."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from longctx_core import contract
from longctx_core.api.spec import load_spec
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.builders.engine import pod_disruption_budget, revision_objects
from longctx_operator.controller.replacement import cordoned, plan_for_revision
from longctx_operator.controller.rollout import group_revisions

REPO = Path(__file__).resolve().parents[2]
CR = yaml.safe_load((REPO / "examples" / "tiny-mla-cpu.yaml").read_text())
CR["metadata"] = {"name": "tiny", "namespace": "ml", "uid": "u-1"}


def cr_with(**roles: dict) -> dict:
    cr = copy.deepcopy(CR)
    for role, fields in roles.items():
        cr["spec"].setdefault(role, {}).update(fields)
    return cr


def running(cr: dict, node: str = "node-a"):
    """The revision `cr` runs, as the API reports it: its StatefulSets and one pod per
    replica on `node`."""
    plan = serving_plan(load_spec(cr["spec"]), cr["metadata"]["name"])
    sets = [o for o in revision_objects(cr, plan, router_for(plan.spec)) if o["kind"] == "StatefulSet"]
    pods = [{"metadata": {"name": f"{s['metadata']['name']}-{i}",
                          "labels": s["spec"]["template"]["metadata"]["labels"]},
             "spec": {"nodeName": node}}
            for s in sets for i in range(s["spec"]["replicas"])]
    return plan, group_revisions(sets, pods)[plan.revision]


def decide(cr: dict, serving, nodes: set[str] = frozenset()):
    plan = serving_plan(load_spec(cr["spec"]), "tiny")
    return plan_for_revision(cr, plan, router_for(plan.spec), serving, set(nodes))


def test_an_unchanged_spec_keeps_the_serving_revision():
    base = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    plan, serving = running(base)
    decided, replaced = decide(base, serving)
    assert replaced is None and decided.revision == serving.name == plan.pairing_key


def test_a_single_pod_roles_edit_is_a_replacement_beside_the_serving_revision():
    base = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    _, serving = running(base)
    edited = copy.deepcopy(base)
    edited["spec"]["engine"].setdefault("extraArgs", {})["decode"] = ["--max-num-seqs", "3"]
    decided, replaced = decide(edited, serving)
    assert replaced is not None and decided.revision == replaced.revision != serving.name
    # Same pairing key: the new pods pair over NIXL exactly as the serving ones did.
    assert decided.pairing_key == serving.name
    (reason,) = replaced.reasons
    assert reason.startswith("decode has one pod (spec.decode.replicas = 1)"), reason
    # Every reconcile of the same edit names the same revision.
    assert decide(edited, serving)[0].revision == decided.revision
    sts = next(o for o in revision_objects(edited, decided, router_for(decided.spec)) if o["kind"] == "StatefulSet")
    assert sts["metadata"]["annotations"][contract.PAIRING_KEY_ANNOTATION] == serving.name
    assert sts["spec"]["template"]["metadata"]["labels"][contract.PAIRING_LABEL] == \
        decided.revision


def test_once_the_replacement_serves_it_is_kept():
    base = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    _, old = running(base)
    edited = copy.deepcopy(base)
    edited["spec"]["engine"].setdefault("extraArgs", {})["prefill"] = ["--max-num-seqs", "3"]
    decided, _ = decide(edited, old)
    sets = [o for o in revision_objects(edited, decided, router_for(decided.spec)) if o["kind"] == "StatefulSet"]
    new = group_revisions(sets, [])[decided.revision]
    again, replaced = decide(edited, new)
    assert replaced is None and again.revision == decided.revision


def test_roles_of_two_pods_roll_in_place():
    base = cr_with(prefill={"replicas": 2}, decode={"replicas": 2})
    _, serving = running(base)
    edited = copy.deepcopy(base)
    edited["spec"]["engine"].setdefault("extraArgs", {})["decode"] = ["--max-num-seqs", "3"]
    decided, replaced = decide(edited, serving)
    assert replaced is None and decided.revision == serving.name


def test_scaling_a_single_pod_role_up_does_not_replace_it():
    base = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    _, serving = running(base)
    decided, replaced = decide(cr_with(prefill={"replicas": 1}, decode={"replicas": 2}), serving)
    assert replaced is None and decided.revision == serving.name


def test_a_single_pod_on_a_cordoned_node_is_replaced_and_the_node_named():
    base = cr_with(prefill={"replicas": 2}, decode={"replicas": 1})
    _, serving = running(base, node="loop-0")
    assert decide(base, serving, {"elsewhere"})[1] is None
    decided, replaced = decide(base, serving, {"loop-0"})
    assert replaced is not None and decided.revision != serving.name
    (reason,) = replaced.reasons      # the two prefill pods can be evicted one at a time
    assert "decode has one pod" in reason and "loop-0" in reason and "drained" in reason


def test_recreate_restarts_in_place_as_the_user_chose():
    base = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    base["spec"]["rollout"] = {"strategy": "Recreate"}
    _, serving = running(base)
    edited = copy.deepcopy(base)
    edited["spec"]["engine"].setdefault("extraArgs", {})["decode"] = ["--max-num-seqs", "3"]
    assert decide(edited, serving)[1] is None


def test_a_new_pairing_key_is_a_surge_of_its_own():
    base = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    _, serving = running(base)
    edited = copy.deepcopy(base)
    edited["spec"]["engine"]["image"] = edited["spec"]["engine"]["image"] + "-next"
    decided, replaced = decide(edited, serving)
    assert replaced is None and decided.revision == decided.pairing_key != serving.name


def test_the_only_pod_of_a_role_is_never_evicted_under_surge():
    for replicas, strategy, allowed in ((1, "Surge", 0), (2, "Surge", 1), (1, "Recreate", 1)):
        cr = cr_with(decode={"replicas": replicas})
        cr["spec"]["rollout"] = {"strategy": strategy}
        plan = serving_plan(load_spec(cr["spec"]), "tiny")
        assert pod_disruption_budget(cr, plan.decode)["spec"]["maxUnavailable"] == allowed


def test_cordoned_reads_the_nodes_unschedulable_flag():
    nodes = [{"metadata": {"name": "a"}, "spec": {"unschedulable": True}},
             {"metadata": {"name": "b"}, "spec": {}}]
    assert cordoned(nodes) == {"a"} and cordoned(None) == set()


def test_a_template_edited_by_hand_is_drift_not_a_replacement():
    base = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    _, serving = running(base)
    sts = serving.statefulsets["decode"]
    sts["spec"]["template"]["spec"]["containers"][0]["command"][-1] = "/etc/longctx/x.json"
    decided, replaced = decide(base, serving)
    assert replaced is None and decided.revision == serving.name
