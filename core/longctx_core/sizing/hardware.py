"""Hardware profiles for the performance model: what one GPU of a node moves and computes.

A profile is plain JSON (`save_profile` / `load_profile`), so `longctx-kernels preflight
--write-profile FILE` can measure a node and `longctx plan --hardware FILE` can use it. The
H200 default is the project's own measurement on one H200 SXM where one exists
(docs/benchmarks.md, benchmarks/prefill_step_kernels.py; torch 2.11, CUDA 13.0) and a
datasheet or documented figure otherwise; `SOURCES` says which.

Efficiencies are the fraction of a rate that one class of kernel reaches; the performance
model multiplies them in (docs/performance.md says which measurement calibrates each).
Stdlib only: the operator imports it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Kernel classes and the fraction of the profile's rate each reaches.
DEFAULT_EFFICIENCY: dict[str, float] = {
    # FP8 GEMMs (projections, the experts' compute) at the profile's fp8 rate, from 1024 rows a
    # GPU up: cuBLASLt fp8 GEMMs of GLM-5.3's projection shapes reach 0.75 at M=1024 and 0.76 at
    # M=8192 (benchmarks/prefill_step_kernels.py). Decode GEMMs are HBM-bound instead.
    "gemm": 0.75,
    # The same GEMMs at 256 rows a GPU (a 2K chunk under PCP8): 0.52, too few output tiles to
    # fill the SMs. Between 256 and 1024 rows the model interpolates on log(rows).
    "gemmFewRows": 0.52,
    # Routed experts, weight-read bound (a few dozen rows an expert): an fp8 grouped GEMM over
    # the 32 local experts of EP8 reads its weights at 0.64 of the copy bandwidth at 32, 64 and
    # 128 rows an expert (gate/up 0.65-0.66, down 0.58-0.62).
    "expertGemm": 0.64,
    # Sparse-MLA prefill (FlashMLA): 640 TFLOP/s published on H800 (the H200's SMs), over the
    # measured bf16 matmul rate of 770 TFLOP/s.
    "sparseMlaPrefill": 0.83,
    # Sparse-MLA decode: FlashMLA's published 410 TFLOP/s (H800) over 770 when compute-bound;
    # HBM-bound it reaches the "hbm" fraction.
    "sparseMlaDecode": 0.53,
    # Indexer prefill logits (DeepGEMM fp8_mqa_logits): ~1.0 PFLOP/s measured on H200 (SGLang's
    # published run), over the fp8 rate of 1540 TFLOP/s.
    "indexerPrefill": 0.65,
    # Every HBM-bound kernel: the project's H200 measurements of HBM-bound kernels, sparse-MLA
    # decode 68%, indexer logits 74%, (indexer + top-k 69%).
    "hbm": 0.70,
    # Indexer decode logits (DeepGEMM fp8_paged_mqa_logits): 149 us against a 134.9 us floor
    # at B=64, L=64K on H200.
    "indexerDecode": 0.90,
    # Prefill top-k's scan of the logits, beside its fixed selection time (topkSelectS): a radix
    # top-k of 256 rows reads 67,584 and 253,952 logits a row at the copy bandwidth (the slope
    # between the two shapes, benchmarks/prefill_step_kernels.py).
    "topkScan": 1.0,
    # HiSparse gather of missing 656-B rows from pinned host memory: 82% of pinned H2D measured.
    "hostGather": 0.82,
}


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU of a node. Rates in bytes/s and FLOP/s, times in seconds."""

    name: str
    hbmBytesPerS: float            # device copy, bytes read + written per second
    bf16FlopsPerS: float           # dense bf16 matmul
    fp8FlopsPerS: float            # dense fp8 matmul
    nvlinkBytesPerS: float         # NCCL bus bandwidth of a collective over the node's GPUs:
                                   # an all-gather's bytes one GPU receives per second
    pcieBytesPerS: float           # pinned host -> device, one GPU
    rdmaBytesPerS: float           # one GPU's NIC, one direction (NIXL prefill -> decode)
    kernelLaunchS: float           # one kernel inside a CUDA graph
    eagerKernelS: float            # one kernel queued in an eager stream (host ahead)
    topkSelectS: float             # a prefill top-k's fixed selection time, one call
    collectiveLatencyS: float      # fixed cost of one NCCL collective inside a node
    efficiency: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))

    def eff(self, kernel: str) -> float:
        return self.efficiency.get(kernel, DEFAULT_EFFICIENCY[kernel])


H200 = HardwareProfile(
    name="H200 SXM (project measurements, docs/benchmarks.md)",
    hbmBytesPerS=4.23e12,
    bf16FlopsPerS=770e12,
    fp8FlopsPerS=1540e12,
    nvlinkBytesPerS=360e9,
    pcieBytesPerS=55.3e9,
    rdmaBytesPerS=50e9,
    kernelLaunchS=1.5e-6,
    eagerKernelS=1.9e-6,
    topkSelectS=30e-6,
    collectiveLatencyS=10e-6,
)

SOURCES: dict[str, str] = {
    "hbmBytesPerS": "measured: 4 GiB device copy, read + written (4.18-4.23 TB/s over runs)",
    "bf16FlopsPerS": "measured: bf16 matmul 8192^3 (764-792 TFLOP/s over runs)",
    "fp8FlopsPerS": "2 x the measured bf16 rate (Hopper's fp8 tensor-core rate is twice bf16)",
    "nvlinkBytesPerS": "documented, not measured here (no 8-GPU machine): NCCL's bus bandwidth "
                       "for collectives other than all-reduce on 8 NVLink-4 GPUs is ~360-370 "
                       "GB/s, the 450 GB/s line rate less protocol overhead (NCCL maintainer, "
                       "NVIDIA/nccl-tests issues 212 and 326); H200 has H100's 18 links. The "
                       "project's 2-GPU all-gather measured 171-222 GB/s a rank (21-83 MB)",
    "pcieBytesPerS": "measured: 1 GiB pinned host -> device copy (52.9-55.4 GB/s over runs)",
    "rdmaBytesPerS": "not measured (the test hosts have no RDMA device): one 400 Gb/s "
                     "ConnectX-7 NIC per GPU, as HGX H200 nodes ship",
    "kernelLaunchS": "measured: a one-element kernel inside a CUDA graph (1.05-1.8 us over runs)",
    "eagerKernelS": "measured: one-element kernels back to back in an eager stream, queued "
                    "behind a sleep so the host is ahead (1.89-1.91 us; the host takes ~10 us "
                    "to issue one torch op)",
    "topkSelectS": "measured: a radix top-k of 2048 over 256 rows takes 46.9 us at 67,584 and "
                   "92.1 us at 253,952 columns; the intercept of the two, 30 us, is its fixed "
                   "selection time",
    "collectiveLatencyS": "not measured: NCCL's tuned minimum is 2.3 us (8 B all-reduce); an "
                          "expert-parallel dispatch or combine pays several of them",
}

_RATES = tuple(f.name for f in fields(HardwareProfile) if f.name not in ("name", "efficiency"))


def profile_to_json(profile: HardwareProfile) -> dict[str, Any]:
    return asdict(profile)


def profile_from_json(data: Any, origin: str = "hardware profile") -> HardwareProfile:
    """A profile from its JSON object; missing rates fall back to the H200's, bad ones fail
    naming the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: expected a JSON object with {', '.join(_RATES)}")
    unknown = set(data) - {f.name for f in fields(HardwareProfile)}
    if unknown:
        raise ValueError(f"{origin}: unknown field(s) {', '.join(sorted(unknown))}; known: "
                         f"name, efficiency, {', '.join(_RATES)}")
    values: dict[str, Any] = {"name": str(data.get("name", origin))}
    for name in _RATES:
        value = data.get(name, getattr(H200, name))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{origin}: {name} must be a positive number, got {value!r}")
        values[name] = float(value)
    efficiency = dict(DEFAULT_EFFICIENCY)
    for kernel, value in (data.get("efficiency") or {}).items():
        if kernel not in DEFAULT_EFFICIENCY:
            raise ValueError(f"{origin}: efficiency.{kernel} is not a kernel class; known: "
                             f"{', '.join(DEFAULT_EFFICIENCY)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"{origin}: efficiency.{kernel} must be in (0, 1], got {value!r}")
        efficiency[kernel] = float(value)
    return HardwareProfile(**values, efficiency=efficiency)


def save_profile(profile: HardwareProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile_to_json(profile), indent=2) + "\n")


def load_profile(path: str | Path) -> HardwareProfile:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"--hardware {path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--hardware {path}: not JSON ({exc})") from None
    return profile_from_json(data, f"--hardware {path}")
