"""Pure builders of the engine objects, from the example and its variants."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from longctx_core.api.spec import load_spec
from longctx_core.quantity import parse_bytes
from longctx_core.plan.roles import role_plan, serving_plan
from longctx_operator.controller.builders.engine import (pod_monitor, revision_objects,
                                              shared_engine_objects)
from longctx_operator.controller.routers import router_for

REPO = Path(__file__).resolve().parents[2]
CR = {**yaml.safe_load((REPO / "examples" / "glm-5.3-1m.yaml").read_text())}
CR["metadata"] = {"name": "glm", "namespace": "ml", "uid": "u-1"}


def objects(cr=CR):
    """The engine objects by kind and name, the revision suffix left out of the names."""
    plan = serving_plan(load_spec(cr["spec"]))
    objs = revision_objects(cr, plan, router_for(plan.spec)) + shared_engine_objects(cr, plan)
    return {(o["kind"], o["metadata"]["name"].removesuffix(f"-{plan.revision}")): o
            for o in objs}


def pod(objs, role):
    return objs[("StatefulSet", f"glm-{role}")]["spec"]["template"]["spec"]


def test_every_object_is_owned_and_labelled():
    for obj in objects().values():
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == "u-1" and owner["controller"] is True
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "glm"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "longctx-operator"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_statefulset_shape(role):
    objs = objects()
    sts = objs[("StatefulSet", f"glm-{role}")]
    spec = load_spec(CR["spec"])
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == f"glm-{role}"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/role"] == role and labels["llm-d.ai/inference-serving"] == "true"
    podspec = pod(objs, role)
    engine = podspec["containers"][0]
    assert engine["command"] == ["longctx-engine", "run", f"/etc/longctx/{role}.json"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert parse_bytes(engine["resources"]["requests"]["memory"]) == role_plan(spec, role).memory.request
    shm = next(v for v in podspec["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm["medium"] == "Memory" and parse_bytes(shm["sizeLimit"]) == role_plan(spec, role).memory.shm
    # /dev/shm holds every rank's CPU offload.
    ports = role_plan(spec, role).ports
    ranks = len(ports.http)
    assert role_plan(spec, role).memory.shm >= ranks * parse_bytes(getattr(spec, role).cpuOffloadPerRank)
    nixl = [p["containerPort"] for p in engine["ports"] if p["name"].startswith("nixl-")]
    assert nixl == [5600 + i for i in range(ranks)]
    env = {e["name"]: e for e in engine["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert engine["startupProbe"]["failureThreshold"] * engine["startupProbe"]["periodSeconds"] >= 3600
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
    term = podspec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["NVIDIA-H200"]
    model = next(v for v in podspec["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


def test_decode_pod_has_the_routing_sidecar_and_host_memory_for_hisparse():
    objs = objects()
    podspec = pod(objs, "decode")
    (sidecar,) = podspec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    spec = load_spec(CR["spec"])
    pools = 8 * parse_bytes("48Gi") + 8 * parse_bytes("16Gi")
    assert role_plan(spec, "decode").memory.request > pools
    assert "initContainers" not in pod(objs, "prefill")


def test_placement_merges_user_choices():
    cr = copy.deepcopy(CR)
    cr["spec"]["placement"] = {"nodeSelector": {"pool": "long"}, "priorityClassName": "serving",
                               "tolerations": [{"key": "dedicated", "operator": "Equal",
                                                "value": "llm", "effect": "NoSchedule"}]}
    cr["spec"]["kvTransfer"] = {"rdma": {"resource": "rdma/ib", "count": 2}}
    podspec = pod(objects(cr), "prefill")
    assert podspec["nodeSelector"] == {"pool": "long"}
    assert podspec["priorityClassName"] == "serving"
    assert {"key": "dedicated", "operator": "Equal", "value": "llm",
            "effect": "NoSchedule"} in podspec["tolerations"]
    assert podspec["containers"][0]["resources"]["limits"]["rdma/ib"] == "2"


def test_hugging_face_token_comes_from_the_secret():
    cr = copy.deepcopy(CR)
    cr["spec"]["model"]["source"] = {"huggingFace": {"tokenSecretRef": {"name": "hf"}}}
    podspec = pod(objects(cr), "decode")
    env = {e["name"]: e for e in podspec["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "HF_TOKEN"}
    assert not any(v["name"] == "model" for v in podspec["volumes"])


def test_a_spec_change_rolls_the_pods_through_the_template():
    before = objects()
    cr = copy.deepcopy(CR)
    cr["spec"]["maxContextTokens"] = 524288
    after = objects(cr)
    key = ("StatefulSet", "glm-prefill")
    a = before[key]["spec"]["template"]["metadata"]["annotations"]["longctx.dev/engine-config"]
    b = after[key]["spec"]["template"]["metadata"]["annotations"]["longctx.dev/engine-config"]
    assert a != b


def test_pdb_per_role_and_pod_monitor():
    objs = objects()
    for role in ("prefill", "decode"):
        pdb = objs[("PodDisruptionBudget", f"glm-{role}")]
        assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == role
    monitor = pod_monitor(CR, serving_plan(load_spec(CR["spec"])))
    ports = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert {"vllm-0", "vllm-7"} <= ports


def test_both_roles_carry_one_pairing_key_that_follows_the_engine_version():
    from longctx_core.plan.revision import pairing_key
    from longctx_operator.controller.routers import router_for
    from longctx_core.contract import PAIRING_LABEL

    def keys(cr):
        objs = objects(cr)
        plan = serving_plan(load_spec(cr["spec"]))
        pool = next(o for o in router_for(plan.spec).objects(cr, plan, plan.revision)
                    if o["kind"] == "InferencePool")
        pods = {objs[("StatefulSet", f"glm-{r}")]["spec"]["template"]["metadata"]["labels"][
            PAIRING_LABEL] for r in ("prefill", "decode")}
        return pods, pool["spec"]["selector"]["matchLabels"][PAIRING_LABEL]

    pods, pool = keys(CR)
    assert pods == {pool} == {pairing_key(load_spec(CR["spec"]))}
    upgraded = copy.deepcopy(CR)
    upgraded["spec"].setdefault("engine", {})["image"] = "ghcr.io/longctx/engine:0.2.0"
    new_pods, new_pool = keys(upgraded)
    # A new engine version: the pool stops selecting old pods, so old and new never pair.
    assert new_pool != pool and new_pods == {new_pool}
    # A new revision is new StatefulSets: the key is in their names and (immutable)
    # selectors, so two revisions never select each other's pods.
    sts = objects(upgraded)[("StatefulSet", "glm-prefill")]
    assert sts["spec"]["selector"]["matchLabels"][PAIRING_LABEL] == new_pool
    assert sts["metadata"]["name"] == f"glm-prefill-{new_pool}"


def test_a_decode_only_edit_changes_only_the_decode_pods():
    cr = copy.deepcopy(CR)
    cr["spec"].setdefault("engine", {}).setdefault("extraArgs", {})["decode"] = [
        "--max-num-seqs", "32"]
    before, after = objects(), objects(cr)

    def digest(objs, role):
        return objs[("StatefulSet", f"glm-{role}")]["spec"]["template"]["metadata"][
            "annotations"]["longctx.dev/engine-config"]
    assert digest(before, "prefill") == digest(after, "prefill")
    assert digest(before, "decode") != digest(after, "decode")
    assert before[("StatefulSet", "glm-prefill")] == after[("StatefulSet", "glm-prefill")]


def test_a_topology_key_spreads_prefill_pods_over_the_domains():
    cr = copy.deepcopy(CR)
    cr["spec"].setdefault("placement", {})["topologyKey"] = "example.com/rack"
    (spread,) = pod(objects(cr), "prefill")["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["maxSkew"], spread["whenUnsatisfiable"]) == (
        "example.com/rack", 1, "DoNotSchedule")
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "prefill"
    assert "topologySpreadConstraints" not in pod(objects(cr), "decode")
    assert "topologySpreadConstraints" not in pod(objects(), "prefill")


def test_the_keys_own_statefulsets_keep_the_selector_and_template_labels_they_had():
    """A StatefulSet's selector cannot change: the key's own role revision selects and labels
    its pods exactly as before role revisions existed, so an operator upgrade applies to
    running StatefulSets (and rolls no pod for a label). Only a replacement's StatefulSet
    names its role revision, which its pods carry."""
    import dataclasses

    from longctx_core import contract
    from longctx_operator.controller.builders.engine import statefulset

    plan = serving_plan(load_spec(CR["spec"]))
    for role in plan.roles:
        sts = statefulset(CR, role, router_for(plan.spec))
        before = {contract.NAME_LABEL: "longctx", contract.INSTANCE_LABEL: "glm",
                  contract.COMPONENT_LABEL: role.role, contract.PAIRING_LABEL: plan.revision}
        assert sts["spec"]["selector"]["matchLabels"] == before
        assert contract.ROLE_REVISION_LABEL not in sts["spec"]["template"]["metadata"]["labels"]
        assert sts["metadata"]["labels"][contract.ROLE_REVISION_LABEL] == plan.revision
        replacement = dataclasses.replace(role, revision="0123456789")
        sts = statefulset(CR, replacement, router_for(plan.spec))
        assert sts["spec"]["selector"]["matchLabels"] == {
            **before, contract.ROLE_REVISION_LABEL: "0123456789"}
        assert sts["spec"]["template"]["metadata"]["labels"][
            contract.ROLE_REVISION_LABEL] == "0123456789"


def test_a_pod_is_selected_by_one_budget_only():
    """The eviction API refuses a pod two PodDisruptionBudgets select: the key's own budget
    leaves a replacement's pods to the replacement's."""
    import dataclasses

    from longctx_core import contract
    from longctx_operator.controller.builders.engine import pod_disruption_budget, statefulset

    def selects(pdb: dict, labels: dict) -> bool:
        sel = pdb["spec"]["selector"]
        return all(labels.get(k) == v for k, v in sel["matchLabels"].items()) and all(
            e["key"] not in labels for e in sel.get("matchExpressions", [])
            if e["operator"] == "DoesNotExist")

    plan = serving_plan(load_spec(CR["spec"]))
    for role in plan.roles:
        replacement = dataclasses.replace(role, revision="0123456789")
        budgets = [pod_disruption_budget(CR, r) for r in (role, replacement)]
        for r in (role, replacement):
            labels = statefulset(CR, r, router_for(plan.spec))["spec"]["template"]["metadata"][
                "labels"]
            assert [selects(b, labels) for b in budgets] == [r is role, r is replacement]
