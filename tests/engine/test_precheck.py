"""Each pre-check's failure message says what to change."""

from __future__ import annotations

import subprocess
import types

from longctx_engine import precheck
from longctx_engine.precheck import (HostProbe, check_env, check_gpus, check_host_memory,
                                     check_shm, check_vllm_version, run_prechecks)
from longctx_core.quantity import GiB
from longctx_core.plan.roles import serving_plan
from longctx_core.vllm_config.recipes import launch_document
from tests.contract.variants import seed_spec as spec_with

SPEC = spec_with()


def document(spec, role):
    return launch_document(serving_plan(spec).role(role), "glm", "llm")


def req(spec, role, kind):
    """The requirement of `kind` the operator renders into the role's launch document."""
    found = [r for r in document(spec, role).requirements if r.kind == kind]
    return found[0] if found else None


def test_shm_too_small():
    r = check_shm(req(SPEC, "prefill", "shm"), 64 * GiB)
    assert not r.ok
    assert "64.0 GiB free" in r.message and "512.0 GiB" in r.message
    assert "sizeLimit of at least 524.0 GiB" in r.message
    assert "spec.prefill.cpuOffloadPerRank" in r.message
    r = check_shm(req(SPEC, "decode", "shm"), 100 * GiB)
    assert not r.ok and "8 rank(s) x 16.0 GiB" in r.message and "128.0 GiB" in r.message
    assert check_shm(req(SPEC, "decode", "shm"), 200 * GiB).ok
    assert not check_shm(req(SPEC, "decode", "shm"), None).ok


def test_shm_not_needed_without_offload():
    spec = spec_with(lambda d: d["prefill"].update(cpuOffloadPerRank=0))
    assert req(spec, "prefill", "shm") is None


def test_host_memory_for_hisparse_pools():
    r = check_host_memory(req(SPEC, "decode", "host-memory"), 400 * GiB)
    assert not r.ok
    assert "HiSparse pins 8 x 48.0 GiB = 384.0 GiB" in r.message
    assert "spec.decode.hiSparse.hostPoolPerRank" in r.message
    assert "95%" in r.message
    assert check_host_memory(req(SPEC, "decode", "host-memory"), 1800 * GiB).ok
    r = check_host_memory(req(SPEC, "decode", "host-memory"), None)
    assert r.ok and r.warning


def test_host_memory_for_prefill_offload():
    r = check_host_memory(req(SPEC, "prefill", "host-memory"), 256 * GiB)
    assert not r.ok and "spec.prefill.cpuOffloadPerRank" in r.message
    assert "hiSparse" not in r.message


def test_gpu_count():
    r = check_gpus(req(SPEC, "prefill", "gpus"), 4, "nvidia-smi -L")
    assert not r.ok
    assert "4 visible" in r.message and "1 rank(s) x 8 GPU(s)" in r.message
    assert "nvidia.com/gpu: 8" in r.message
    assert not check_gpus(req(SPEC, "decode", "gpus"), None, "nothing").ok
    assert check_gpus(req(SPEC, "decode", "gpus"), 8, "x").ok
    many = check_gpus(req(SPEC, "decode", "gpus"), 16, "x")
    assert many.ok and many.warning


def test_visible_gpu_count_sources(tmp_path):
    assert precheck.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})[0] == 4
    assert precheck.visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""})[0] == 0
    assert precheck.visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,-1,3"})[0] == 2

    def smi(*a, **k):
        return types.SimpleNamespace(returncode=0, stdout="GPU 0: H200 (UUID: a)\n"
                                                          "GPU 1: H200 (UUID: b)\n")
    assert precheck.visible_gpu_count({}, run=smi) == (2, "nvidia-smi -L")

    def no_smi(*a, **k):
        raise FileNotFoundError("nvidia-smi")
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    n, how = precheck.visible_gpu_count({}, run=no_smi, dev_glob=str(tmp_path / "nvidia[0-9]*"))
    assert n == 3 and "/dev/nvidiaN" in how
    n, how = precheck.visible_gpu_count({}, run=no_smi, dev_glob=str(tmp_path / "none*"))
    assert n is None


def test_env_conflicts():
    r = check_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert not r.ok and "expandable_segments" in r.message and "remove" in r.message
    r = check_env({"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert not r.ok and "Model Runner V2" in r.message
    r = check_env({"VLLM_KV_CACHE_LAYOUT": "NHD"})
    assert not r.ok and "VLLM_KV_CACHE_LAYOUT" in r.message
    r = check_env({"VLLM_PORT": "tcp://10.0.0.1:8000"})
    assert r.ok and r.warning and "enableServiceLinks" in r.message
    assert check_env({}).ok


def test_vllm_version():
    assert check_vllm_version("0.33.0", "0.33.0").ok
    assert check_vllm_version("0.33.0", "0.33.0+cu129").ok
    r = check_vllm_version("0.33.0", "0.32.1")
    assert not r.ok and "spec.engine.vllmVersion" in r.message
    assert not check_vllm_version("0.33.0", None).ok


def test_meminfo_and_statvfs(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:  2113000000 kB\nMemFree: 1 kB\nMemAvailable:   2000000000 kB\n")
    assert precheck.mem_available_bytes(str(f)) == 2000000000 * 1024
    assert precheck.mem_available_bytes(str(tmp_path / "missing")) is None
    assert precheck.shm_free_bytes(str(tmp_path)) > 0
    assert precheck.shm_free_bytes(str(tmp_path / "missing")) is None


def test_run_prechecks_with_injected_probe():
    probe = HostProbe(shm_free=lambda: 200 * GiB, mem_available=lambda: 1800 * GiB,
                      gpus=lambda: (8, "test"), vllm_version=lambda: "0.33.0", env={})
    results = run_prechecks(document(SPEC, "decode"), probe)
    assert [r.name for r in results] == ["vLLM version", "GPUs", "/dev/shm", "host memory",
                                         "environment"]
    assert all(r.ok for r in results), [r.line() for r in results]
    probe.shm_free = lambda: 1 * GiB
    assert [r.name for r in run_prechecks(document(SPEC, "decode"), probe)
            if not r.ok] == ["/dev/shm"]
