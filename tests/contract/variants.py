"""The recipe variants every contract and unit test exercises (one place)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from longctx_core.api.spec import LongContextDeploymentSpec, load_spec
from longctx_core.vllm_config.recipes import EngineCommand
from longctx_core.plan.roles import serving_plan
from tests.engine_pods import pod, pod_command

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"


def deep_merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """Writes `update` into `into`, nested mappings key by key, values copied."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def example_manifest() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def example_spec_dict() -> dict[str, Any]:
    return copy.deepcopy(example_manifest()["spec"])


def spec_with(edit: Callable[[dict], None] | None = None) -> LongContextDeploymentSpec:
    d = example_spec_dict()
    if edit:
        edit(d)
    return load_spec(d)


def seed_spec(edit: Callable[[dict], None] | None = None) -> LongContextDeploymentSpec:
    """The example with the seed's decode pools (48 GiB HiSparse pool, 16 GiB offload per
    rank), so tests can compare with the reference command lines whatever the example
    file's current sizing is."""
    def both(d: dict) -> None:
        d["decode"]["hiSparse"]["hostPoolPerRank"] = "48Gi"
        d["decode"]["cpuOffloadPerRank"] = "16Gi"
        if edit:
            edit(d)
    return spec_with(both)


def _dp8_prefill(d: dict) -> None:
    d["prefill"].update(dataParallel=8, contextParallel={"prefill": 1, "decode": 1},
                        cpuOffloadPerRank="64Gi")


def _offload_only(d: dict) -> None:
    d["decode"]["hiSparse"] = {"enabled": False}


def _multipod(d: dict) -> None:
    d["decode"].update(dataParallel=16, replicas=2)


def _one_rank_per_pod(d: dict) -> None:
    d["decode"].update(tensorParallel=8, dataParallel=2, replicas=2, cpuOffloadPerRank="64Gi")


def _extra(d: dict) -> None:
    d.setdefault("engine", {})["extraArgs"] = {
        "prefill": ["--max-num-batched-tokens", "16384", "--gpu-memory-utilization=0.9",
                    "--attention-backend", "FLASHMLA_SPARSE"],
        "decode": ["--max-num-seqs=64", "--block-size", "64", "--attention-backend",
                   "FLASHMLA_SPARSE", "--disable-access-log-for-endpoints",
                   "/health,/metrics,/v1/models"],
    }
    d["decode"]["hiSparse"]["deviceBufferSize"] = 10240


@dataclass(frozen=True)
class Variant:
    id: str
    role: str
    edit: Callable[[dict], None] | None = None
    ordinal: int = 0

    def spec(self) -> LongContextDeploymentSpec:
        return spec_with(self.edit)

    def command(self) -> EngineCommand:
        return pod_command(serving_plan(self.spec()).role(self.role), pod(self.role, self.ordinal))


VARIANTS = [
    Variant("target-prefill", "prefill"),
    Variant("target-decode", "decode"),
    Variant("dp8-prefill-baseline", "prefill", _dp8_prefill),
    Variant("offload-only-decode", "decode", _offload_only),
    Variant("multipod-decode-rank1", "decode", _multipod, ordinal=1),
    Variant("multipod-decode-rank0", "decode", _multipod, ordinal=0),
    Variant("one-rank-per-pod-decode", "decode", _one_rank_per_pod, ordinal=1),
    Variant("extra-args-prefill", "prefill", _extra),
    Variant("extra-args-decode", "decode", _extra),
]
