"""The engine pods' NetworkPolicy (builders/network_policy.py) and their security context
(builders/engine.py): what each admits, off by default, and the Pod Security level."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from longctx_core import contract
from longctx_core.api.spec import load_spec
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.builders.engine import (engine_security_context, pod_security_level,
                                              revision_objects)
from longctx_operator.controller.builders.network_policy import OPERATOR_LABELS, network_policy
from longctx_operator.controller.desired import desired_objects

REPO = Path(__file__).resolve().parents[2]
CR = yaml.safe_load((REPO / "examples" / "glm-5.3-1m.yaml").read_text())
CR["metadata"] = {"name": "glm", "namespace": "ml", "uid": "u-1"}
GATEWAY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def cr_with(**network_policy) -> dict:
    cr = copy.deepcopy(CR)
    cr["spec"]["networkPolicy"] = network_policy
    return cr


def kinds(cr: dict) -> set[str]:
    plan = serving_plan(load_spec(cr["spec"]))
    return {o["kind"] for o in desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=False)}


def test_off_by_default_and_owned_when_on():
    assert "NetworkPolicy" not in kinds(CR)
    assert "NetworkPolicy" in kinds(cr_with(enabled=True))


def test_serving_ports_only_from_the_picker_and_clients_metrics_only_from_scrapers():
    cr = cr_with(enabled=True, clients=[GATEWAY], scrapers=[PROMETHEUS])
    plan = serving_plan(load_spec(cr["spec"]))
    policy = network_policy(cr, plan)
    spec = policy["spec"]
    # Serving and draining engine pods alike: a draining pod still holds requests.
    engines = {"matchLabels": {contract.INSTANCE_LABEL: "glm"}, "matchExpressions": [
        {"key": contract.SERVING_LABEL, "operator": "In", "values": ["true", "draining"]}]}
    assert spec["podSelector"] == engines
    assert spec["policyTypes"] == ["Ingress"]
    same_cr, picker, clients, scrapers, operator = spec["ingress"]
    # Between the CR's own prefill and decode pods: every port (NIXL's transfer ports are
    # chosen at run time).
    assert same_cr == {"from": [{"podSelector": engines}]}
    serving = [{"protocol": "TCP", "port": p} for p in plan.pool_target_ports]
    assert picker["ports"] == serving and clients["ports"] == serving
    assert picker["from"][0]["podSelector"]["matchLabels"][contract.COMPONENT_LABEL] == "router"
    assert clients["from"] == [GATEWAY] and scrapers["from"] == [PROMETHEUS]
    nixl = {p for role in plan.roles for p in role.ports.nixl}
    open_outside = {p["port"] for rule in spec["ingress"][1:] for p in rule["ports"]}
    assert not nixl & open_outside, "a NIXL side channel port is open outside the CR"
    assert {p["port"] for p in scrapers["ports"]} == {
        p for role in plan.roles for p in role.ports.http}
    # The operator reads the draining pods' vLLM metrics (engine_load.py), from its own
    # namespace, whichever that is.
    assert operator == {"from": [{"namespaceSelector": {},
                                  "podSelector": {"matchLabels": OPERATOR_LABELS}}],
                        "ports": scrapers["ports"]}
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_no_clients_no_client_rule():
    plan = serving_plan(load_spec(cr_with(enabled=True)["spec"]))
    assert len(network_policy(cr_with(enabled=True), plan)["spec"]["ingress"]) == 3


def engine_container(cr: dict, role: str) -> dict:
    plan = serving_plan(load_spec(cr["spec"]))
    (sts,) = [o for o in revision_objects(cr, plan, router_for(plan.spec)) if o["kind"] == "StatefulSet"
              and o["metadata"]["labels"][contract.COMPONENT_LABEL] == role]
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (engine,) = [c for c in pod["containers"] if c["name"] == contract.ENGINE_CONTAINER]
    return engine


def test_engines_run_restricted_without_rdma_and_add_only_ipc_lock_with_it():
    for role in contract.ROLES:
        sc = engine_container(CR, role)["securityContext"]
        assert sc == {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                      "runAsUser": contract.ENGINE_UID, "runAsGroup": contract.ENGINE_UID,
                      "capabilities": {"drop": ["ALL"]},
                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod_security_level(load_spec(CR["spec"])) == "restricted"
    rdma = copy.deepcopy(CR)
    rdma["spec"]["kvTransfer"] = {"rdma": {"resource": "rdma/ib", "count": 1}}
    plan = serving_plan(load_spec(rdma["spec"]))
    assert engine_security_context(plan.decode)["capabilities"] == {
        "drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert pod_security_level(plan.spec) == "privileged"


def test_a_user_without_a_passwd_entry_gets_a_writable_home():
    engine = engine_container(CR, "decode")
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["HOME"] == contract.ENGINE_HOME and env["USER"]
    assert {"name": "vllm-cache", "mountPath": contract.ENGINE_HOME} in engine["volumeMounts"]
