"""P/D compatibility: the NIXL compatibility-hash factors."""

from __future__ import annotations

import dataclasses
import json

from longctx_core.vllm_config.compat import hma_problem, pd_compatibility
from longctx_core.vllm_config.recipes import EngineCommand
from longctx_core.plan.roles import serving_plan
from tests.engine_pods import pod, pod_command
from tests.contract.variants import seed_spec as spec_with


def pair(p_edit=None, d_edit=None):
    p = pod_command(serving_plan(spec_with(p_edit)).prefill, pod("prefill"))
    d = pod_command(serving_plan(spec_with(d_edit)).decode, pod("decode"))
    return p, d


def replace_flag(cmd: EngineCommand, name: str, value: str) -> EngineCommand:
    argv = list(cmd.argv)
    argv[argv.index(name) + 1] = value
    return dataclasses.replace(cmd, argv=argv)


def test_target_pair_and_baselines_are_compatible():
    assert pd_compatibility(*pair()) == []
    dp8 = lambda d: d["prefill"].update(dataParallel=8, contextParallel={"prefill": 1,
                                                                        "decode": 1})
    offload_only = lambda d: d["decode"].update(hiSparse={"enabled": False})
    assert pd_compatibility(*pair(dp8, offload_only)) == []


def test_model_string_mismatch():
    out = pd_compatibility(*pair(d_edit=lambda d: d["model"].update(name="/models/GLM")))
    assert len(out) == 1 and "--model string" in out[0] and "/models/GLM" in out[0]


def test_vllm_version_mismatch():
    out = pd_compatibility(*pair(d_edit=lambda d: d["engine"].update(vllmVersion="0.34.0")))
    assert len(out) == 1 and "vLLM version" in out[0]


def test_kv_dtype_is_canonicalised():
    p, d = pair()
    assert pd_compatibility(replace_flag(p, "--kv-cache-dtype", "fp8"), d) == []
    out = pd_compatibility(replace_flag(p, "--kv-cache-dtype", "auto"), d)
    assert len(out) == 1 and "KV cache dtype" in out[0]


def test_speculative_method_and_draft():
    out = pd_compatibility(*pair(p_edit=lambda d: d["engine"].update(
        speculative={"method": "none"})))
    assert len(out) == 1 and "speculative decoding is off on prefill" in out[0]
    p, d = pair()
    legacy = replace_flag(p, "--speculative-config",
                          json.dumps({"method": "deepseek_mtp", "num_speculative_tokens": 1}))
    assert pd_compatibility(legacy, d) == []   # same method after vLLM's rename; n not hashed
    draft = replace_flag(p, "--speculative-config",
                         json.dumps({"method": "mtp", "num_speculative_tokens": 3,
                                     "model": "other/draft"}))
    out = pd_compatibility(draft, d)
    assert len(out) == 1 and "speculative model" in out[0]


def test_hybrid_kv_cache_manager_must_be_on_both():
    p, d = pair()
    off = dataclasses.replace(d, argv=d.argv + ["--disable-hybrid-kv-cache-manager"])
    out = pd_compatibility(p, off)
    assert len(out) == 1 and "hybrid KV cache manager is off on decode" in out[0]
    lm = replace_flag(p, "--kv-transfer-config", json.dumps(
        {"kv_connector": "MultiConnector", "kv_role": "kv_producer",
         "kv_connector_extra_config": {"connectors": [
             {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
             {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}]}}))
    assert "LMCacheConnectorV1" in hma_problem(lm)


def test_attention_backend_and_transfer_mode():
    p, d = pair()
    pinned = dataclasses.replace(p, argv=p.argv + ["--attention-backend=FLASHMLA_SPARSE"])
    assert any("--attention-backend" in m for m in pd_compatibility(pinned, d))
    push = replace_flag(d, "--kv-transfer-config",
                        json.dumps({"kv_connector": "NixlPushConnector",
                                    "kv_role": "kv_consumer"}))
    assert any("transfer mode" in m for m in pd_compatibility(p, push))


def test_roles_swapped_and_missing_nixl():
    p, d = pair()
    out = pd_compatibility(d, p)
    assert any("prefill NIXL kv_role" in m for m in out)
    none = replace_flag(d, "--kv-transfer-config", json.dumps(
        {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"cpu_bytes_to_use": 1}}))
    assert any("decode has no NIXL connector" in m for m in pd_compatibility(p, none))
