"""The data path's fault settings (faults.py) reach vLLM 0.33 as its parser and config
classes read them: decode's kv_load_failure_policy on the top-level KVTransferConfig that
the scheduler reads, the NIXL lease in the NixlConnector child's own config (the one the
connector's scheduler and worker call get_from_extra_config on), both roles alike."""

from __future__ import annotations

import pytest

from longctx_core.plan import faults
from longctx_core.sizing.hardware import H200
from longctx_core.sizing.cost_terms import model_shape
from longctx_core.sizing.performance import summary_at_max_context
from longctx_core.sizing.phase_timing import prefill
from longctx_core.sizing.planner import role_layouts

from .test_vllm_contract import parse
from .variants import VARIANTS, Variant, spec_with


def nixl_child(vllm, top):
    """The NixlConnector's config as vLLM builds it (MultiConnector gives each child its
    own KVTransferConfig with the parent's engine_id)."""
    if top.kv_connector != "MultiConnector":
        return top
    (child,) = [c for c in top.kv_connector_extra_config["connectors"]
                if c["kv_connector"] == "NixlConnector"]
    return vllm.KVTransferConfig(**{**child, "engine_id": top.engine_id})


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_vllm_reads_the_planned_fault_settings(vllm, variant: Variant):
    cmd = variant.command()
    _, engine_args = parse(vllm, cmd.argv)
    top = engine_args.kv_transfer_config
    assert isinstance(top, vllm.KVTransferConfig)
    settings = faults.fault_settings(variant.spec())
    policy = settings.kv_load_failure_policy if variant.role == "decode" else "fail"
    assert top.kv_load_failure_policy == policy
    assert nixl_child(vllm, top).get_from_extra_config("kv_lease_duration", None) == \
        settings.kv_lease_seconds


def test_vllm_rejects_an_unknown_failure_policy(vllm):
    with pytest.raises(Exception, match="kv_load_failure_policy"):
        vllm.KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_consumer",
                              kv_load_failure_policy="retry")


def test_one_million_tokens_fail_fast_instead_of_recomputing_on_a_decode_rank():
    spec = spec_with()
    settings = faults.fault_settings(spec)
    assert spec.maxContextTokens == 1048576
    assert settings.kv_load_failure_policy == "fail"
    shape = model_shape(spec)
    _, decode = role_layouts(spec)
    # The recompute the policy avoids: the whole prompt on one decode rank.
    assert settings.recompute_seconds == prefill(shape, decode, H200, spec.maxContextTokens).seconds
    assert settings.recompute_seconds > 2 * settings.retry_seconds


def test_short_contexts_on_a_prefill_like_decode_layout_recompute():
    """Where a decode rank prefills as fast as a retry costs, recompute spares the client
    an error (the policy is computed, not fixed)."""
    def same_layout(d: dict) -> None:
        d["prefill"].update(dataParallel=8, contextParallel={"prefill": 1, "decode": 1})
        d["maxContextTokens"] = 131072
    settings = faults.fault_settings(spec_with(same_layout))
    assert settings.recompute_seconds <= settings.retry_seconds
    assert settings.kv_load_failure_policy == "recompute"


def test_the_request_timeout_outlasts_a_queued_max_context_prefill_and_its_answer():
    spec = spec_with()
    settings = faults.fault_settings(spec)
    rate = summary_at_max_context(spec)["decode"]["tokensPerSecondPerUser"]
    assert settings.request_timeout_seconds >= (
        faults.REQUEST_TTFT_FACTOR * settings.retry_seconds
        + faults.STREAMED_ANSWER_TOKENS / rate)
    assert settings.kv_lease_seconds >= faults.HEARTBEATS_PER_LEASE * settings.longest_step_seconds
    assert settings.kv_lease_seconds >= faults.VLLM_DEFAULT_LEASE_SECONDS


def test_an_explicit_architecture_gets_the_unpriced_bounds():
    def explicit(d: dict) -> None:
        d["model"].pop("preset")
        d["model"]["architecture"] = {"layers": 78, "mtpLayers": 1, "attentionHeads": 64,
                                      "kvLoraRank": 512, "qkRopeHeadDim": 64}
        d["capacity"] = {"kvBudgetPerGpu": "60Gi"}
    settings = faults.fault_settings(spec_with(explicit))
    assert (settings.kv_load_failure_policy, settings.request_timeout_seconds) == (
        "fail", faults.UNPRICED_REQUEST_TIMEOUT_SECONDS)
