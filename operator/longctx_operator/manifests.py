"""Reading a LongContextDeployment from a file, and writing manifests (the CLI's commands)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from longctx_core import contract


def read_manifest(path: str) -> dict[str, Any]:
    """The one LongContextDeployment in a YAML file ("-" for standard input)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    crs = [d for d in docs if d.get("kind") == contract.KIND]
    if len(crs) != 1:
        raise SystemExit(f"error: {path} must hold exactly one {contract.KIND}, found {len(crs)}")
    cr = crs[0]
    cr.setdefault("metadata", {}).setdefault("namespace", "default")
    return cr


class ManifestDumper(yaml.SafeDumper):
    """Writes every repeated value out in full: manifests are read by people and diff tools,
    which `&id001` / `*id001` aliases defeat."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
