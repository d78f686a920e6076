"""The engine pods under the real API server's PodSecurity admission, in a namespace
labelled with the level builders/engine.py claims (pod_security_level), and the
NetworkPolicy as the operator renders and the API server validates it."""

from __future__ import annotations

import copy
import json

import pytest

from longctx_core import contract
from longctx_core.api.spec import load_spec
from longctx_operator.controller.builders.engine import pod_security_level
from longctx_operator.controller.builders.network_policy import engine_pods
from tests.conftest import example_cr, wait_for

pytestmark = pytest.mark.cluster
GATEWAY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}


def enforce(cluster, namespace: str, level: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "--overwrite",
                    f"pod-security.kubernetes.io/enforce={level}",
                    "pod-security.kubernetes.io/enforce-version=latest")


def ready(cluster, namespace: str, name: str) -> bool:
    cr = cluster.get("lcd", name, namespace) or {}
    status = cr.get("status") or {}
    return status.get("phase") == "Ready" and status.get("observedGeneration") == cr.get(
        "metadata", {}).get("generation")


def refusals(cluster, namespace: str) -> list[str]:
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    return [e["message"] for e in events["items"]
            if e.get("reason") == "FailedCreate" and "PodSecurity" in e.get("message", "")]


def test_tcp_engines_run_under_restricted_with_the_network_policy(cluster, operator, namespace):
    cr = example_cr("psa")
    cr["spec"]["networkPolicy"] = {"enabled": True, "clients": [GATEWAY]}
    assert pod_security_level(load_spec(cr["spec"])) == "restricted"
    enforce(cluster, namespace, "restricted")
    assert cluster.apply(cr, namespace).returncode == 0
    wait_for(lambda: ready(cluster, namespace, "psa"), 120, "Ready under restricted")
    assert refusals(cluster, namespace) == []
    pods = cluster.list("pods", namespace, f"{contract.INSTANCE_LABEL}=psa")
    assert {p["metadata"]["labels"].get(contract.COMPONENT_LABEL) for p in pods} >= {
        "prefill", "decode", contract.ROUTER_COMPONENT}
    policy = cluster.get("networkpolicy", contract.network_policy("psa"), namespace)
    assert policy is not None, "the NetworkPolicy was not created"
    ingress = policy["spec"]["ingress"]
    assert ingress[0]["from"][0]["podSelector"] == engine_pods("psa")
    assert [rule["from"] for rule in ingress].count([GATEWAY]) == 1
    off = copy.deepcopy(cr)
    off["spec"]["networkPolicy"] = {"enabled": False}
    assert cluster.apply(off, namespace).returncode == 0
    wait_for(lambda: cluster.get("networkpolicy", contract.network_policy("psa"), namespace)
             is None, 30, "the NetworkPolicy removed when turned off")


def test_rdma_engines_need_privileged_and_nothing_stricter(cluster, operator, namespace):
    cr = example_cr("rdma")
    cr["spec"]["kvTransfer"] = {"rdma": {"resource": "rdma/ib", "count": 1}}
    assert pod_security_level(load_spec(cr["spec"])) == "privileged"
    enforce(cluster, namespace, "baseline")
    assert cluster.apply(cr, namespace).returncode == 0
    refused = wait_for(lambda: refusals(cluster, namespace), 60, "baseline refusing the pods")
    assert any("IPC_LOCK" in m for m in refused), refused
    enforce(cluster, namespace, "privileged")
    wait_for(lambda: ready(cluster, namespace, "rdma"), 120, "Ready under privileged")
