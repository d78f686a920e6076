"""What the capacity planner's tests share: the example spec and variations of it, the
GLM-5.3 figures they check against, and the value a refusal offers."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from longctx_core.api import spec as api
from longctx_core.api.spec import load_spec
from longctx_core.sizing import models
from tests.contract.variants import deep_merge

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"
GLM = models.PRESETS["glm-5.3"]
ONE_M = 1_048_576
K = 1024


def example_spec() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["spec"]


def spec_with(**changes) -> api.LongContextDeploymentSpec:
    """The example spec with nested overrides: spec_with(prefill={"dataParallel": 8})."""
    raw = example_spec()
    deep_merge(raw, changes)
    return load_spec(raw)


DP8_PREFILL = {"contextParallel": {"prefill": 1, "decode": 1}, "dataParallel": 8,
               "cpuOffloadPerRank": "64Gi"}


def offered_value(pattern: str, refusal: str) -> str:
    """The first value a refusal offers as a fix, found by `pattern`'s group."""
    found = re.findall(pattern, refusal)
    assert found, refusal
    return found[0]
