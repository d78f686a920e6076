"""Which role revisions a spec runs: a role's only pod is replaced beside the serving one,
never restarted in place, when its template changes or its node is drained, and the other
role keeps its pods."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from longctx_core import contract
from longctx_core.api.spec import load_spec
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.builders.engine import pod_disruption_budget, revision_objects
from longctx_operator.controller.replacement import plan_for_revision, role_swap
from longctx_operator.controller.rollout import DRAINING_ANNOTATION, group_revisions

REPO = Path(__file__).resolve().parents[2]
CR = yaml.safe_load((REPO / "examples" / "tiny-mla-cpu.yaml").read_text())
CR["metadata"] = {"name": "tiny", "namespace": "ml", "uid": "u-1"}


def cr_with(**roles: dict) -> dict:
    cr = copy.deepcopy(CR)
    for role, fields in roles.items():
        cr["spec"].setdefault(role, {}).update(fields)
    return cr


def objects(cr: dict, plan, created: int = 0) -> tuple[list[dict], list[dict]]:
    """The StatefulSets of `plan` as the API reports them (created at `created` seconds),
    and one pod per replica on node-a."""
    sets = [o for o in revision_objects(cr, plan, router_for(plan.spec))
            if o["kind"] == "StatefulSet"]
    for s in sets:
        s["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{created:02d}Z"
    pods = [{"metadata": {"name": f"{s['metadata']['name']}-{i}",
                          "labels": s["spec"]["template"]["metadata"]["labels"]},
             "spec": {"nodeName": "node-a"}}
            for s in sets for i in range(s["spec"]["replicas"])]
    return sets, pods


def running(cr: dict, node: str = "node-a"):
    """The revision `cr` runs, as the API reports it: its StatefulSets and one pod per
    replica on `node`."""
    plan = serving_plan(load_spec(cr["spec"]), cr["metadata"]["name"])
    sets, pods = objects(cr, plan)
    for p in pods:
        p["spec"]["nodeName"] = node
    return plan, group_revisions(sets, pods)[plan.revision]


def decide(cr: dict, live, nodes: set[str] = frozenset(), serves: bool = True):
    plan = serving_plan(load_spec(cr["spec"]), "tiny")
    return plan_for_revision(cr, plan, router_for(plan.spec), live, serves, set(nodes))


def single(**engine) -> dict:
    cr = cr_with(prefill={"replicas": 1}, decode={"replicas": 1})
    cr["spec"]["engine"].update(engine)
    return cr


DECODE_EDIT = {"extraArgs": {"decode": ["--max-num-seqs", "3"]}}


def test_an_unchanged_spec_keeps_each_roles_revision():
    base = single()
    plan, serving = running(base)
    decided, replaced = decide(base, serving)
    assert replaced is None and decided.role_revisions == dict.fromkeys(
        contract.ROLES, plan.pairing_key) and decided.revision == plan.pairing_key


def test_a_single_pod_roles_edit_replaces_that_role_alone_beside_the_serving_one():
    _, serving = running(single())
    edited = single(**DECODE_EDIT)
    decided, replaced = decide(edited, serving)
    assert replaced is not None and replaced.roles == ("decode",)
    # The same pairing key: the new decode pods pair over NIXL as the serving ones did.
    assert decided.revision == decided.pairing_key == serving.name
    assert decided.role_revisions == {"prefill": serving.name, "decode": replaced.revision}
    assert replaced.revision != serving.name
    (reason,) = replaced.reasons
    assert reason.startswith("decode has one pod (spec.decode.replicas = 1)"), reason
    assert "prefill keeps its pods" in replaced.describe()
    # Every reconcile of the same edit names the same role revision.
    assert decide(edited, serving)[0].role_revisions == decided.role_revisions
    sets = {o["metadata"]["name"]: o for o in revision_objects(
        edited, decided, router_for(decided.spec)) if o["kind"] == "StatefulSet"}
    prefill = sets[contract.statefulset("tiny", "prefill", serving.name)]
    decode = sets[contract.statefulset("tiny", "decode", replaced.revision)]
    # The prefill StatefulSet is the serving one, unchanged: its pod does not restart.
    live = serving.statefulsets["prefill"]
    assert prefill["spec"] == live["spec"] and \
        prefill["metadata"]["annotations"] == live["metadata"]["annotations"]
    labels = decode["spec"]["template"]["metadata"]["labels"]
    assert labels[contract.PAIRING_LABEL] == serving.name
    assert labels[contract.ROLE_REVISION_LABEL] == replaced.revision


def with_replacement(edited: dict):
    """The serving revision once the replacement's StatefulSets exist beside the old."""
    plan, serving = running(single())
    decided, replaced = decide(edited, serving)
    sets, pods = objects(single(), plan)
    new_sets, new_pods = objects(edited, decided, created=5)
    names = {s["metadata"]["name"] for s in sets}
    both = sets + [s for s in new_sets if s["metadata"]["name"] not in names]
    pods += [p for p in new_pods if p["metadata"]["name"].rsplit("-", 1)[0] not in names]
    return decided, replaced, group_revisions(both, pods)[plan.revision]


def test_once_the_replacement_exists_it_is_kept_and_swapped_in():
    edited = single(**DECODE_EDIT)
    decided, replaced, live = with_replacement(edited)
    again, none = decide(edited, live)
    assert none is None and again.role_revisions == decided.role_revisions
    swap = role_swap(again, live.focused(again.role_revisions))
    assert swap.roles == ("decode",) and swap.new.name == replaced.revision
    assert swap.old.name == live.name and not swap.switched
    assert [p["metadata"]["name"] for p in swap.leaving] == [
        f"{contract.statefulset('tiny', 'decode', live.name)}-0"]
    assert swap.retired("tiny", [live.name]) == {
        contract.statefulset("tiny", "decode", live.name),
        contract.engine_configmap("tiny", live.name)}
    for pod in swap.old.pods:
        pod["metadata"]["annotations"] = {DRAINING_ANNOTATION: "2026-01-01T00:00:09Z"}
    assert swap.switched
    # A look at the prefill role finds its one StatefulSet, the serving one's.
    focused = live.focused(again.role_revisions)
    assert [p["metadata"]["name"] for p in focused.role_pods("decode")] == [
        f"{contract.statefulset('tiny', 'decode', replaced.revision)}-0"]


def test_a_third_edit_supersedes_a_replacement_none_of_whose_pods_got_ready():
    _, replaced, live = with_replacement(single(**DECODE_EDIT))
    third = single(extraArgs={"decode": ["--max-num-seqs", "5"]})
    decided, again = decide(third, live)
    assert again is not None and again.revision not in (live.name, replaced.revision)
    swap = role_swap(decided, live)
    assert swap.old.name == live.name and swap.superseded.name == replaced.revision
    assert swap.retired("tiny", [replaced.revision]) == {
        contract.statefulset("tiny", "decode", replaced.revision),
        contract.engine_configmap("tiny", replaced.revision)}


def test_reverting_the_edit_swaps_back_to_the_serving_pods():
    decided, replaced, live = with_replacement(single(**DECODE_EDIT))
    back, none = decide(single(), live)
    assert none is None and back.role_revisions == dict.fromkeys(contract.ROLES, live.name)
    swap = role_swap(back, live)
    assert swap.new.name == live.name and swap.old.name == replaced.revision


def test_roles_of_two_pods_roll_in_place():
    base = cr_with(prefill={"replicas": 2}, decode={"replicas": 2})
    _, serving = running(base)
    edited = copy.deepcopy(base)
    edited["spec"]["engine"].update(DECODE_EDIT)
    decided, replaced = decide(edited, serving)
    assert replaced is None and decided.role_revisions == dict.fromkeys(
        contract.ROLES, serving.name)


def test_scaling_a_single_pod_role_up_does_not_replace_it():
    _, serving = running(single())
    decided, replaced = decide(cr_with(prefill={"replicas": 1}, decode={"replicas": 2}), serving)
    assert replaced is None and decided.role_revisions["decode"] == serving.name


def test_a_single_pod_on_a_cordoned_node_is_replaced_and_the_node_named():
    base = cr_with(prefill={"replicas": 2}, decode={"replicas": 1})
    _, serving = running(base, node="loop-0")
    assert decide(base, serving, {"elsewhere"})[1] is None
    decided, replaced = decide(base, serving, {"loop-0"})
    assert replaced is not None and replaced.roles == ("decode",)
    (reason,) = replaced.reasons      # the two prefill pods can be evicted one at a time
    assert "decode has one pod" in reason and "loop-0" in reason and "drained" in reason
    assert decided.role_revisions["prefill"] == serving.name


def test_recreate_restarts_in_place_as_the_user_chose():
    base = single()
    base["spec"]["rollout"] = {"strategy": "Recreate"}
    _, serving = running(base)
    edited = copy.deepcopy(base)
    edited["spec"]["engine"].update(DECODE_EDIT)
    assert decide(edited, serving)[1] is None


def test_a_new_pairing_key_names_both_roles_for_it():
    _, serving = running(single())
    edited = single(image=single()["spec"]["engine"]["image"] + "-next")
    decided, replaced = decide(edited, None, serves=False)
    assert replaced is None and decided.revision == decided.pairing_key != serving.name
    assert decided.role_revisions == dict.fromkeys(contract.ROLES, decided.pairing_key)


def test_the_only_pod_of_a_role_is_never_evicted_under_surge():
    for replicas, strategy, allowed in ((1, "Surge", 0), (2, "Surge", 1), (1, "Recreate", 1)):
        cr = cr_with(decode={"replicas": replicas})
        cr["spec"]["rollout"] = {"strategy": strategy}
        plan = serving_plan(load_spec(cr["spec"]), "tiny")
        assert pod_disruption_budget(cr, plan.decode)["spec"]["maxUnavailable"] == allowed


def test_cordoned_reads_the_nodes_unschedulable_flag():
    nodes = [{"metadata": {"name": "a"}, "spec": {"unschedulable": True}},
             {"metadata": {"name": "b"}, "spec": {}}]
    from longctx_operator.controller.observe import Snapshot

    def cordoned(nodes):
        return Snapshot({}, None, nodes, None, {}, (), frozenset()).cordoned
    assert cordoned(nodes) == {"a"} and cordoned(None) == set()


def test_a_template_edited_by_hand_is_drift_not_a_replacement():
    base = single()
    _, serving = running(base)
    sts = serving.statefulsets["decode"]
    sts["spec"]["template"]["spec"]["containers"][0]["command"][-1] = "/etc/longctx/x.json"
    decided, replaced = decide(base, serving)
    assert replaced is None and decided.role_revisions["decode"] == serving.name
