"""The example LongContextDeployment that the router and picker builders' tests build from."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from longctx_core.api import spec as api

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"


def make_cr(spec_patch: dict[str, Any] | None = None, name: str = "glm",
            namespace: str = "llm") -> tuple[dict[str, Any], api.LongContextDeploymentSpec]:
    """The example CR as `name` in `namespace`, its spec deep-merged with `spec_patch`, and
    that spec loaded."""
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["metadata"].update(name=name, namespace=namespace, uid="3f8b1c9e-0000-4000-8000-000000000001")

    def merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for key, value in src.items():
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                merge(dst[key], value)
            else:
                dst[key] = value

    merge(cr["spec"], copy.deepcopy(spec_patch or {}))
    return cr, api.load_spec(cr["spec"])
