"""The endpoint's objects (builders/endpoint.py): what it sends through, its bounds from the
spec or the plan, and what keeps its own changes from cutting an answer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx_core import contract
from longctx_core.api.spec import load_spec
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.builders import endpoint
from longctx_operator.controller.builders.network_policy import network_policy

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "tiny-mla-cpu.yaml").read_text())


def cr(**spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(EXAMPLE)
    out["metadata"] = {"name": "tiny", "namespace": "ml", "uid": "u-1"}
    for key, value in spec.items():
        out["spec"][key] = {**out["spec"].get(key, {}), **value}
    return out


def objects(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    plan = serving_plan(load_spec(c["spec"]))
    return {o["kind"]: o for o in endpoint.endpoint_objects(c, plan)}


def args(c: dict[str, Any]) -> dict[str, str]:
    flags = objects(c)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    return dict(zip(flags[::2], flags[1::2]))


VLLM_ROUTER = {"router": {"type": "vllm-router"}}


def test_every_object_is_named_for_the_cr_and_the_service_listens_on_the_endpoint_port():
    objs = objects(cr(**VLLM_ROUTER))
    assert sorted(objs) == ["Deployment", "PodDisruptionBudget", "Role", "RoleBinding",
                            "Service", "ServiceAccount"]
    assert {o["metadata"]["name"] for o in objs.values()} == {"tiny-endpoint"}
    assert objs["Service"]["spec"]["ports"][0]["port"] == contract.ENDPOINT_PORT
    assert objs["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                      "verbs": ["get", "list", "watch"]}]
    assert endpoint.url("tiny", "ml") == "http://tiny-endpoint.ml.svc:8090"


def test_vllm_router_pods_are_found_by_label_and_llm_d_goes_through_its_gateway():
    assert "--router-url" not in args(cr(**VLLM_ROUTER))
    assert args(cr(router={"type": "llm-d", "gateway": {"name": "gw", "namespace": "edge"}}))[
        "--router-url"] == "http://gw.edge.svc:80"
    assert args(cr(router={"type": "llm-d", "gateway": {"name": "gw"}},
                   endpoint={"routerURL": "https://gw.example:8443"}))[
        "--router-url"] == "https://gw.example:8443"
    # llm-d with no gateway: nothing to send through, no endpoint.
    assert objects(cr(router={"type": "llm-d"})) == {}
    assert objects(cr(endpoint={"enabled": False}, **VLLM_ROUTER)) == {}


def test_the_bounds_come_from_the_spec_or_else_the_plans_request_timeout():
    plan = serving_plan(load_spec(cr(**VLLM_ROUTER)["spec"]))
    timeout = str(plan.prefill.faults.request_timeout_seconds)
    a = args(cr(**VLLM_ROUTER))
    assert (a["--max-attempts"], a["--give-up-seconds"], a["--drain-seconds"]) == (
        "3", timeout, timeout)
    a = args(cr(endpoint={"continuation": {"maxAttempts": 5, "giveUpSeconds": 30},
                          "drainSeconds": 0}, **VLLM_ROUTER))
    assert (a["--max-attempts"], a["--give-up-seconds"], a["--drain-seconds"]) == (
        "5", "30", "0")
    assert a["--namespace"] == "ml" and a["--instance"] == "tiny"


def test_its_own_changes_surge_first_drain_and_leave_one_pod_at_a_time():
    objs = objects(cr(endpoint={"drainSeconds": 120}, **VLLM_ROUTER))
    dep = objs["Deployment"]["spec"]
    assert dep["replicas"] == 2
    assert dep["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = dep["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/longctx/longctx-operator:0.1.0"
    assert container["command"] == ["longctx-endpoint"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health",
                                                      "port": contract.ENDPOINT_PORT}
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + 120
    assert objs["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("enabled", [True, False])
def test_the_network_policy_admits_the_endpoint_to_the_serving_ports(enabled):
    c = cr(networkPolicy={"enabled": True}, endpoint={"enabled": enabled}, **VLLM_ROUTER)
    policy = network_policy(c, serving_plan(load_spec(c["spec"])))
    sources = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    admitted = {"podSelector": {"matchLabels": contract.selector_labels(
        "tiny", contract.ENDPOINT_COMPONENT)}} in sources
    assert admitted == enabled
