"""Unit tests of the router builders (operator/longctx_operator/controller/builders/router.py):
the objects the llm-d Router returns (the InferencePool, the picker's Deployment, Service and
RBAC, the HTTPRoute), the ports they route to and the decode pods' routing sidecar."""

from __future__ import annotations

import re
from typing import Any

import pytest

from longctx_core.plan.revision import pairing_key
from longctx_core import contract
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.builders import router
from longctx_operator.controller.builders.digest import content_digest
from longctx_operator.controller.routers import router_for
from tests.operator.router_example import make_cr


def router_objects(cr, plan):
    """The spec's router objects, sending requests to the plan's revision."""
    return router_for(plan.spec).objects(cr, plan, plan.revision)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {o["kind"]: o for o in objects}
    assert len(out) == len(objects), "one object per kind"
    return out


@pytest.fixture
def glm():
    cr, spec = make_cr()
    return cr, spec, by_kind(router_objects(cr, serving_plan(spec)))


# ---------------------------------------------------------------- objects


def test_all_objects_are_owned_and_labelled(glm):
    cr, _, objects = glm
    owner = contract.owner_reference(cr)
    assert set(objects) == {"InferencePool", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
                            "Service", "Deployment"}
    for obj in objects.values():
        meta = obj["metadata"]
        assert meta["namespace"] == "llm"
        assert meta["ownerReferences"] == [owner]
        assert meta["labels"] == contract.labels("glm", "router")
        assert "llm-d.ai/role" not in meta["labels"]  # the picker is not a model server
    assert objects["InferencePool"]["metadata"]["name"] == "glm"
    for kind in ("ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"):
        assert objects[kind]["metadata"]["name"] == "glm-epp"


def test_inference_pool(glm):
    _, spec, objects = glm
    pool = objects["InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"] == {
        "matchLabels": contract.serving_selector("glm", pairing_key(spec))}
    # Decode DP8 on one 8-GPU pod: a target port per rank; the PCP8 prefill pod is one rank.
    assert pool["spec"]["targetPorts"] == [{"number": 8000 + i} for i in range(8)]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "", "kind": "Service", "name": "glm-epp", "port": {"number": 9002},
        "failureMode": "FailOpen"}


def test_pool_selector_matches_serving_pods_of_both_roles_only():
    selector = contract.serving_selector("glm", "k1")
    for role in ("prefill", "decode"):
        assert selector.items() <= contract.labels("glm", role, "k1").items()
        assert not selector.items() <= contract.labels("glm", role, "k2").items()
    assert not selector.items() <= contract.labels("glm", "router").items()
    assert not selector.items() <= contract.labels("other", "decode").items()


def test_ports_per_role_and_active_ports_annotation():
    _, spec = make_cr()
    assert serving_plan(spec).role("prefill").ports.serving == [8000]
    assert serving_plan(spec).role("decode").ports.serving == list(range(8000, 8008))
    assert router.pod_annotations(serving_plan(spec).role("prefill")) == {
        "llm-d.ai/active-ports": "8000", "inference.networking.k8s.io/active-ports": "8000"}
    decode_ports = "8000,8001,8002,8003,8004,8005,8006,8007"
    assert router.pod_annotations(serving_plan(spec).role("decode")) == {
        "llm-d.ai/active-ports": decode_ports,
        "inference.networking.k8s.io/active-ports": decode_ports}
    # Every annotated port is a pool target port (the picker ignores the others).
    targets = set(serving_plan(spec).pool_target_ports)
    for role in ("prefill", "decode"):
        assert set(serving_plan(spec).role(role).ports.serving) <= targets

    # The DP8 prefill baseline (PCP 1, 8 ranks) and a TP2 decode (4 ranks per pod).
    _, spec = make_cr({"prefill": {"dataParallel": 8, "contextParallel": {"prefill": 1, "decode": 1}},
                       "decode": {"tensorParallel": 2, "dataParallel": 4}})
    assert serving_plan(spec).role("prefill").ports.serving == list(range(8000, 8008))
    assert serving_plan(spec).role("decode").ports.serving == list(range(8000, 8004))
    assert list(serving_plan(spec).pool_target_ports) == list(range(8000, 8008))

    # Decode DP16 over two pods: 8 ranks per pod, not 16.
    _, spec = make_cr({"decode": {"dataParallel": 16, "replicas": 2}})
    assert serving_plan(spec).decode.layout.ranks_per_pod == 8


def test_more_than_eight_ranks_per_pod_is_refused():
    _, spec = make_cr({"decode": {"gpusPerPod": 16, "dataParallel": 16}})
    with pytest.raises(ValueError, match="at most 8"):
        router_objects(make_cr()[0], serving_plan(spec))


def test_picker_deployment(glm):
    _, spec, objects = glm
    dep = objects["Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    template = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    assert pod["serviceAccountName"] == "glm-epp"
    (container,) = pod["containers"]
    assert container["image"] == spec.router.pickerImage
    assert re.search(r":v\d+\.\d+\.\d+$", container["image"]), "pinned image"
    args = container["args"]
    for arg in ("--pool-name=glm", "--pool-namespace=llm",
                "--pool-group=inference.networking.k8s.io",
                "--config-file=/config/epp-config.yaml", "--grpc-port=9002",
                "--grpc-health-port=9003", "--metrics-port=9090"):
        assert arg in args
    assert len({a.split("=")[0] for a in args}) == len(args), "no flag twice"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 9002, "grpc-health": 9003, "metrics": 9090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/config" and mounts["config"]["readOnly"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "glm-epp"
    assert "epp-config.yaml" in objects["ConfigMap"]["data"]


def test_config_change_restarts_the_picker():
    def hash_of(patch):
        cr, spec = make_cr(patch)
        dep = by_kind(router_objects(cr, serving_plan(spec)))["Deployment"]
        return dep["spec"]["template"]["metadata"]["annotations"][contract.PICKER_CONFIG_ANNOTATION]

    same = hash_of({})
    assert same == hash_of({}), "stable for one spec"
    assert same != hash_of({"router": {"prefixCache": {"lruCapacityPerServer": 1000}}})
    assert same != hash_of({"router": {"disaggregation": {"decider": "prefix-based"}}})
    cr, spec = make_cr()
    objects = by_kind(router_objects(cr, serving_plan(spec)))
    text = objects["ConfigMap"]["data"]["epp-config.yaml"]
    assert content_digest(text) == same


def test_picker_service(glm):
    _, _, objects = glm
    svc = objects["Service"]["spec"]
    assert svc["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p for p in svc["ports"]}
    assert ports["grpc-ext-proc"]["port"] == 9002
    assert ports["grpc-ext-proc"]["appProtocol"] == "kubernetes.io/h2c"
    assert ports["http-metrics"]["port"] == 9090


def test_rbac_is_minimal(glm):
    _, _, objects = glm
    role = objects["Role"]
    granted = {(group, res, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for res in rule["resources"] for verb in rule["verbs"]}
    read = {"get", "list", "watch"}
    expected = {("", "pods", v) for v in read} | \
               {("inference.networking.k8s.io", "inferencepools", v) for v in read} | \
               {(g, r, v) for g in ("llm-d.ai", "inference.networking.x-k8s.io")
                for r in ("inferenceobjectives", "inferencemodelrewrites") for v in read}
    assert granted == expected
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert "nonResourceURLs" not in rule
    binding = objects["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "glm-epp"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "glm-epp",
                                    "namespace": "llm"}]
    assert objects["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == \
        objects["ServiceAccount"]["metadata"]["name"]


def test_http_route_only_with_gateway():
    cr, spec = make_cr()
    assert "HTTPRoute" not in by_kind(router_objects(cr, serving_plan(spec)))
    cr, spec = make_cr({"router": {"gateway": {"name": "llm-d-inference-gateway",
                                               "namespace": "gateways"}}})
    route = by_kind(router_objects(cr, serving_plan(spec)))["HTTPRoute"]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["name"] == "glm"
    assert route["metadata"]["ownerReferences"] == [contract.owner_reference(cr)]
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "llm-d-inference-gateway",
                                            "namespace": "gateways"}]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool", "name": "glm"}]
    cr, spec = make_cr({"router": {"gateway": {"name": "gw"}}})
    route = by_kind(router_objects(cr, serving_plan(spec)))["HTTPRoute"]
    assert route["spec"]["parentRefs"][0]["namespace"] == "llm"  # defaults to the CR's


def test_router_disabled_gives_nothing():
    cr, spec = make_cr({"router": {"enabled": False}})
    assert router_objects(cr, serving_plan(spec)) == []


# ---------------------------------------------------------------- sidecar


def test_routing_sidecar():
    _, spec = make_cr()
    sidecar = router.routing_sidecar(serving_plan(spec).decode)
    assert sidecar["name"] == "routing-proxy"
    assert sidecar["restartPolicy"] == "Always"  # native sidecar
    assert sidecar["image"] == spec.router.sidecarImage
    args = sidecar["args"]
    assert "--kv-connector=nixlv2" in args
    assert "--data-parallel-size=8" in args
    assert "--port=8000" in args and "--model-server-port=8200" in args
    assert "--secure-proxy=false" in args
    assert "--enable-ssrf-protection=false" in args
    assert len({a.split("=")[0] for a in args}) == len(args)
    ports = [(p["name"], p["containerPort"]) for p in sidecar["ports"]]
    assert ports == [(f"proxy-r{i}", 8000 + i) for i in range(8)]
    assert all(len(name) <= 15 for name, _ in ports)
    # Listening ports = the decode pods' active ports = pool target ports.
    assert [p for _, p in ports] == serving_plan(spec).role("decode").ports.serving
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert sidecar["livenessProbe"]["httpGet"]["port"] == 8000
    assert "startupProbe" in sidecar
    sc = sidecar["securityContext"]
    assert sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sidecar["resources"]["requests"]["cpu"] and sidecar["resources"]["limits"]["memory"]

    _, spec = make_cr({"decode": {"tensorParallel": 2, "dataParallel": 4}})
    sidecar = router.routing_sidecar(serving_plan(spec).decode)
    assert "--data-parallel-size=4" in sidecar["args"] and len(sidecar["ports"]) == 4
