"""Unit tests of the endpoint picker's builders
(operator/longctx_operator/controller/builders/picker.py): its config and its status.

The EndpointPickerConfig is checked against the picker's published Go types, decoded
strictly as the picker does (llm-d-router apix/config/v1alpha1 and each plugin's parameter
struct): the picker module cannot be fetched from the Go module proxy here (see
docs/router.md), so this is the stand-in for loading it with the real binary.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from longctx_core.api import spec as api
from longctx_core.sizing import planner
from longctx_core.sizing.prefix_index import rank_tokens
from longctx_operator.controller.builders import picker
from tests.operator.router_example import REPO, make_cr


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
    # pkg/epp/framework/plugins/scheduling/scorer/nohitlru/no_hit_lru.go
    "no-hit-lru-scorer": {"lruSize": int, "prefixMatchInfoProducerName": str,
                          "prefixPluginType": str, "prefixPluginName": str},
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


def test_picker_config_is_strictly_valid_for_every_decider():
    for patch in ({"router": {"disaggregation": {"decider": "auto"}}},
                  {"router": {"disaggregation": {"decider": "always"}}},
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
                     "no-hit-lru-scorer", "prefill-filter", "decode-filter", "max-score-picker"):
        assert required in plugins
    profiles = {p["name"]: [r["pluginRef"] for r in p["plugins"]] for p in cfg["schedulingProfiles"]}
    # New sessions spread over both roles' endpoints; later turns follow their prefix.
    assert all("no-hit-lru-scorer" in refs and "prefix-cache-scorer" in refs
               for refs in profiles.values())
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
