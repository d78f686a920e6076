"""Unit tests of the router builders (operator/longctx_operator/controller/builders/router.py and picker.py).

The EndpointPickerConfig is also checked against the picker's published Go types, decoded
strictly as the picker does (llm-d-router apix/config/v1alpha1 and each plugin's parameter
struct): the picker module cannot be fetched from the Go module proxy here (see
docs/router.md), so this is the stand-in for loading it with the real binary.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx_core.api import spec as api
from longctx_core.sizing import planner
from longctx_core.sizing.prefix_index import rank_tokens
from longctx_core.vllm_config.revision import pairing_key
from longctx_core import contract
from longctx_core.sizing.roles import serving_plan
from longctx_operator.controller.builders import picker, router
from longctx_operator.controller.builders.digest import content_digest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"


def make_cr(spec_patch: dict[str, Any] | None = None, name: str = "glm",
            namespace: str = "llm") -> tuple[dict[str, Any], api.LongContextDeploymentSpec]:
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["metadata"].update(name=name, namespace=namespace, uid="3f8b1c9e-0000-4000-8000-000000000001")

    def merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for key, value in src.items():
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                merge(dst[key], value)
            else:
                dst[key] = value

    merge(cr["spec"], copy.deepcopy(spec_patch or {}))
    return cr, api.load_spec(cr["spec"])


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {o["kind"]: o for o in objects}
    assert len(out) == len(objects), "one object per kind"
    return out


@pytest.fixture
def glm():
    cr, spec = make_cr()
    return cr, spec, by_kind(router.router_objects(cr, serving_plan(spec)))


# ---------------------------------------------------------------- picker config schema
# Field names of llm-d-router apix/config/v1alpha1/endpointpickerconfig_types.go (decoded
# with serializer.EnableStrict) and the parameter structs of the plugins used (decoded with
# plugin.StrictDecoder): an unknown field anywhere makes the picker refuse to start.

TOP_LEVEL = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles", "dataLayer",
             "flowControl", "requestHandler", "saturationDetector", "parser"}
PLUGIN_SPEC = {"name", "type", "parameters"}
PROFILE = {"name", "plugins"}
PROFILE_PLUGIN = {"pluginRef", "weight"}
# Plugin type -> accepted parameter fields (None: the factory ignores parameters).
PLUGIN_PARAMETERS: dict[str, Any] = {
    # pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/types.go
    "approx-prefix-cache-producer": {"autoTune": bool, "blockSizeTokens": int, "blockSize": int,
                                     "maxPrefixBlocksToMatch": int,
                                     "maxPrefixTokensToMatch": int, "lruCapacityPerServer": int},
    # pkg/epp/framework/plugins/scheduling/scorer/prefix
    "prefix-cache-scorer": {"matchLengthWeight": (int, float), "matchLengthScaleTokens": int,
                            "prefixMatchInfoProducerName": str},
    "queue-scorer": {},
    "kv-cache-utilization-scorer": {},
    "prefill-filter": {},
    "decode-filter": {},
    "max-score-picker": {"maxNumOfEndpoints": int},
    # pkg/epp/framework/plugins/scheduling/profilehandler/disagg/*.go
    "always-disagg-pd-decider": None,
    "prefix-based-pd-decider": {"nonCachedTokens": int, "promptTokens": int},
    "disagg-profile-handler": {
        "stageOrder": str,
        "profiles": {"decode": str, "prefill": str, "encode": str, "fallback": str},
        "deciders": {"prefill": str, "encode": str},
    },
}
PROFILE_HANDLERS = {"disagg-profile-handler"}
DECIDERS = {"always-disagg-pd-decider", "prefix-based-pd-decider"}


def _strict(value: Any, schema: Any, where: str) -> None:
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: expected an object, got {value!r}"
        unknown = set(value) - set(schema)
        assert not unknown, f"{where}: unknown field(s) {sorted(unknown)} (strict decoding)"
        for key, sub in value.items():
            _strict(sub, schema[key], f"{where}.{key}")
    else:
        assert isinstance(value, schema) and not (schema is int and isinstance(value, bool)), \
            f"{where}: {value!r} is not {schema}"


def validate_picker_config(cfg: dict[str, Any]) -> None:
    """Strict decode + the loader's reference checks (pkg/epp/config/loader)."""
    assert cfg["apiVersion"] == "llm-d.ai/v1alpha1" and cfg["kind"] == "EndpointPickerConfig"
    assert not set(cfg) - TOP_LEVEL, f"unknown top-level fields {set(cfg) - TOP_LEVEL}"
    names: dict[str, str] = {}
    for i, plugin in enumerate(cfg["plugins"]):
        assert not set(plugin) - PLUGIN_SPEC, f"plugins[{i}]: unknown {set(plugin) - PLUGIN_SPEC}"
        ptype = plugin["type"]
        assert ptype in PLUGIN_PARAMETERS, f"plugins[{i}]: unknown or unexpected type {ptype}"
        name = plugin.get("name") or ptype  # applyStaticDefaults
        assert name not in names, f"duplicate plugin name {name}"
        names[name] = ptype
        schema = PLUGIN_PARAMETERS[ptype]
        if schema is not None and "parameters" in plugin:
            _strict(plugin["parameters"], schema, f"plugins[{i}].parameters")
    handlers = [n for n, t in names.items() if t in PROFILE_HANDLERS]
    assert len(handlers) == 1, "exactly one profile handler"
    profiles = {}
    for profile in cfg["schedulingProfiles"]:
        assert not set(profile) - PROFILE
        for ref in profile["plugins"]:
            assert not set(ref) - PROFILE_PLUGIN
            assert ref["pluginRef"] in names, f"unknown pluginRef {ref['pluginRef']}"
            if "weight" in ref:
                assert isinstance(ref["weight"], (int, float))
        profiles[profile["name"]] = profile
    handler = next(p for p in cfg["plugins"] if (p.get("name") or p["type"]) == handlers[0])
    params = handler.get("parameters") or {}
    prefill_decider = params.get("deciders", {}).get("prefill")
    assert prefill_decider in names and names[prefill_decider] in DECIDERS
    for stage in ("decode", "prefill"):
        assert params.get("profiles", {}).get(stage, stage) in profiles
    assert params.get("stageOrder", "decode-first") == "decode-first"


def test_picker_config_is_strictly_valid_for_both_deciders():
    for patch in ({"router": {"disaggregation": {"decider": "always"}}},
                  {"router": {"disaggregation": {"decider": "prefix-based",
                                                 "nonCachedTokens": 512, "promptTokens": 2048}}}):
        _, spec = make_cr(patch)
        validate_picker_config(picker.picker_config(spec))
        # What the picker reads is the YAML text in the ConfigMap.
        validate_picker_config(yaml.safe_load(picker.picker_config_text(spec)))


def test_validator_rejects_what_the_picker_rejects():
    _, spec = make_cr()
    cfg = picker.picker_config(spec)
    bad = copy.deepcopy(cfg)
    bad["plugins"][0]["parameters"]["blockSizeTokenz"] = 64
    with pytest.raises(AssertionError, match="unknown field"):
        validate_picker_config(bad)
    bad = copy.deepcopy(cfg)
    bad["plugins"].append({"type": "pd-profile-handler"})
    with pytest.raises(AssertionError):
        validate_picker_config(bad)
    bad = copy.deepcopy(cfg)
    bad["schedulingProfiles"][0]["plugins"].append({"pluginRef": "nope"})
    with pytest.raises(AssertionError, match="unknown pluginRef"):
        validate_picker_config(bad)


def test_picker_config_content_follows_the_spec():
    _, spec = make_cr({"router": {"prefixCache": {"blockSize": 128, "maxPrefixTokensToMatch": 262144,
                                                  "lruCapacityPerServer": 50000},
                                  "disaggregation": {"decider": "prefix-based",
                                                     "nonCachedTokens": 256, "promptTokens": 1024}}})
    cfg = picker.picker_config(spec)
    plugins = {p["type"]: p for p in cfg["plugins"]}
    assert plugins["approx-prefix-cache-producer"]["parameters"] == {
        "autoTune": False, "blockSizeTokens": 128, "maxPrefixTokensToMatch": 262144,
        "lruCapacityPerServer": 50000}
    assert plugins["prefix-based-pd-decider"]["parameters"] == {"nonCachedTokens": 256,
                                                                "promptTokens": 1024}
    assert "always-disagg-pd-decider" not in plugins
    assert plugins["disagg-profile-handler"]["parameters"] == {
        "deciders": {"prefill": "prefix-based-pd-decider"}}
    for required in ("prefix-cache-scorer", "queue-scorer", "kv-cache-utilization-scorer",
                     "prefill-filter", "decode-filter", "max-score-picker"):
        assert required in plugins
    profiles = {p["name"]: [r["pluginRef"] for r in p["plugins"]] for p in cfg["schedulingProfiles"]}
    assert profiles["prefill"][0] == "prefill-filter" and profiles["decode"][0] == "decode-filter"
    assert "prefill-filter" not in profiles["decode"] and "decode-filter" not in profiles["prefill"]

    _, spec = make_cr()  # the example: always
    plugins = {p["type"]: p for p in picker.picker_config(spec)["plugins"]}
    assert "parameters" not in plugins["always-disagg-pd-decider"]
    assert plugins["disagg-profile-handler"]["parameters"]["deciders"]["prefill"] == \
        "always-disagg-pd-decider"


def test_prefix_index_of_every_example_is_sized_from_its_plan():
    """Prints the table of docs/router.md#prefix-index-sizing (run with -s)."""
    rows = ["| example | maxContextTokens | prefill tokens/rank | decode tokens/rank "
            "| lruCapacityPerServer | maxPrefixTokensToMatch |", "|---|---:|---:|---:|---:|---:|"]
    for path in sorted((REPO / "examples").glob("*.yaml")):
        spec = api.load_spec(yaml.safe_load(path.read_text())["spec"])
        params = {p["type"]: p for p in picker.picker_config(spec)["plugins"]}[
            "approx-prefix-cache-producer"]["parameters"]
        tokens = {r.role: r.total for r in rank_tokens(spec, planner.plan(spec))}
        block = spec.router.prefixCache.blockSize
        assert params["blockSizeTokens"] == block
        assert params["lruCapacityPerServer"] == max(-(-max(tokens.values()) // block), 1)
        assert params["maxPrefixTokensToMatch"] == spec.maxContextTokens
        if path.name.startswith("glm-5.3-1m"):
            # The old fixed defaults (31,250 blocks, 131,072 tokens) under-sized these.
            assert params["lruCapacityPerServer"] > 31250
            assert params["maxPrefixTokensToMatch"] > 131072
        rows.append(f"| {path.name} | {spec.maxContextTokens:,} | {tokens['prefill']:,} | "
                    f"{tokens['decode']:,} | {params['lruCapacityPerServer']:,} | "
                    f"{params['maxPrefixTokensToMatch']:,} |")
    assert len(rows) > 3
    print("\n" + "\n".join(rows))


def test_no_deprecated_plugin_or_field():
    for decider in ("always", "prefix-based"):
        _, spec = make_cr({"router": {"disaggregation": {"decider": decider}}})
        cfg = picker.picker_config(spec)
        types = {p["type"] for p in cfg["plugins"]}
        assert not types & picker.DEPRECATED_PLUGIN_TYPES
        assert not any(t.endswith("-headers-handler") or t.startswith("by-label") for t in types)
        text = picker.picker_config_text(spec)
        # Deprecated spellings: character-based blockSize, legacy deciderPluginName,
        # top-level parser/saturationDetector, the deprecated config group.
        for word in ("deciderPluginName", "maxPrefixBlocksToMatch", "inference.networking.x-k8s.io",
                     "saturationDetector", "parser:", "primaryPort"):
            assert word not in text
        assert not re.search(r"^\s*blockSize:", text, re.M)


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
        router.router_objects(make_cr()[0], serving_plan(spec))


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
        dep = by_kind(router.router_objects(cr, serving_plan(spec)))["Deployment"]
        return dep["spec"]["template"]["metadata"]["annotations"][contract.PICKER_CONFIG_ANNOTATION]

    same = hash_of({})
    assert same == hash_of({}), "stable for one spec"
    assert same != hash_of({"router": {"prefixCache": {"lruCapacityPerServer": 1000}}})
    assert same != hash_of({"router": {"disaggregation": {"decider": "prefix-based"}}})
    cr, spec = make_cr()
    objects = by_kind(router.router_objects(cr, serving_plan(spec)))
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
    assert "HTTPRoute" not in by_kind(router.router_objects(cr, serving_plan(spec)))
    cr, spec = make_cr({"router": {"gateway": {"name": "llm-d-inference-gateway",
                                               "namespace": "gateways"}}})
    route = by_kind(router.router_objects(cr, serving_plan(spec)))["HTTPRoute"]
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
    route = by_kind(router.router_objects(cr, serving_plan(spec)))["HTTPRoute"]
    assert route["spec"]["parentRefs"][0]["namespace"] == "llm"  # defaults to the CR's


def test_router_disabled_gives_nothing():
    cr, spec = make_cr({"router": {"enabled": False}})
    assert router.router_objects(cr, serving_plan(spec)) == []


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


# ---------------------------------------------------------------- status


def test_picker_status():
    assert picker.picker_status(None) == (False, "PickerMissing",
                                          "the endpoint picker Deployment does not exist yet")
    dep = {"metadata": {"name": "glm-epp", "generation": 2}, "spec": {"replicas": 1},
           "status": {"observedGeneration": 1}}
    assert picker.picker_status(dep)[:2] == (False, "PickerProgressing")
    dep["status"] = {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                     "availableReplicas": 0,
                     "conditions": [{"type": "Available", "status": "False"}]}
    ready, reason, message = picker.picker_status(dep)
    assert (ready, reason) == (False, "PickerUnavailable") and "0/1" in message
    dep["status"]["conditions"].append({"type": "ReplicaFailure", "status": "True",
                                        "message": "pods \"glm-epp-x\" is forbidden: quota"})
    assert picker.picker_status(dep)[:2] == (False, "PickerReplicaFailure")
    dep["status"] = {"observedGeneration": 2, "updatedReplicas": 1, "availableReplicas": 1,
                     "conditions": [{"type": "Progressing", "status": "False",
                                     "reason": "ProgressDeadlineExceeded"}]}
    assert picker.picker_status(dep)[:2] == (False, "PickerStalled")
    dep["status"]["conditions"] = [{"type": "Available", "status": "True"}]
    ready, reason, message = picker.picker_status(dep)
    assert (ready, reason) == (True, "PickerAvailable") and "1/1" in message
