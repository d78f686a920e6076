"""Helpers for the chart tests: the real helm binary, rendering, and the operator's needs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "longctx"
KUSTOMIZE_BASE = REPO / "charts" / "kustomize" / "base"
KUSTOMIZE_SCRIPT = REPO / "charts" / "kustomize" / "generate.sh"


def helm_binary() -> Path:
    """The helm built by tools/build-control-plane.sh (LONGCTX_BIN_DIR, or run the script)."""
    override = os.environ.get("LONGCTX_BIN_DIR")
    if override:
        bin_dir = Path(override)
    else:
        proc = subprocess.run(["bash", str(REPO / "tools" / "build-control-plane.sh")],
                              stdout=subprocess.PIPE, text=True)
        assert proc.returncode == 0, "tools/build-control-plane.sh failed (see its output)"
        bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    helm = bin_dir / "helm"
    assert helm.is_file(), f"{helm} is missing: run tools/build-control-plane.sh"
    return helm


def helm_env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "HELM_CACHE_HOME": str(tmp / "cache"),
            "HELM_CONFIG_HOME": str(tmp / "config"), "HELM_DATA_HOME": str(tmp / "data")}


def run_helm(helm: Path, tmp: Path, *args: str, check: bool = True
             ) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                          env=helm_env(tmp))
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}"
    return proc


def set_args(values: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in values.items():
        flag = "--set-string" if isinstance(value, str) else "--set"
        if isinstance(value, bool):
            value = str(value).lower()
        args += [flag, f"{key}={value}"]
    return args


def template_text(helm: Path, tmp: Path, values: dict[str, Any] | None = None, *,
                  release: str = "longctx", namespace: str = "longctx-system",
                  include_crds: bool = False) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace, *set_args(values or {})]
    if include_crds:
        args.append("--include-crds")
    return run_helm(helm, tmp, *args).stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every combination a rule list grants."""
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", [])}
