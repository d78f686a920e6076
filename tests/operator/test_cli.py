"""The `longctx` CLI: plan, render and crd work offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"


def longctx(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "longctx_operator.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_plan_table_and_json():
    table = longctx("plan", "-f", str(EXAMPLE))
    assert table.returncode == 0, table.stderr
    assert "Prefill" in table.stdout and "Decode" in table.stdout and "54,728" in table.stdout
    out = longctx("plan", "-f", str(EXAMPLE), "-o", "json")
    plan = json.loads(out.stdout)
    for key in ("kvBytesPerToken", "request", "prefill", "decode"):
        assert key in plan
    assert {"mla", "indexer", "mtp", "total"} <= set(plan["kvBytesPerToken"])
    assert {"kvGiBPerGpu", "fits", "sparseMlaFlopsPerByte", "indexerCrossoverTokens"} <= set(
        plan["prefill"])
    assert {"maxConcurrentAtMaxContext", "fits"} <= set(plan["decode"])
    assert "kvGiB" in plan["request"]


def test_plan_of_a_refused_layout_exits_3_and_says_what_to_change():
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["spec"]["prefill"]["contextParallel"] = {"prefill": 8, "decode": 1}
    out = longctx("plan", "-f", "-", stdin=yaml.safe_dump(cr))
    assert out.returncode == 3
    assert "spec.prefill.contextParallel" in out.stdout


def test_render_prints_the_whole_graph_as_plain_manifests():
    out = longctx("render", "-f", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "InferencePool",
            "Deployment", "Role", "RoleBinding", "ServiceAccount"} <= kinds
    assert all("ownerReferences" not in d["metadata"] for d in docs)
    engine = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "glm-engine")
    assert "engine.yaml" in engine["data"]


def test_bad_spec_names_the_field():
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["spec"]["decode"]["replicaz"] = 1
    out = longctx("render", "-f", "-", stdin=yaml.safe_dump(cr))
    assert out.returncode == 2
    assert "spec.decode" in out.stderr and "replicaz" in out.stderr


def test_crd_command_prints_the_committed_crd():
    out = longctx("crd")
    assert out.stdout == (REPO / "crds" / "longctx.dev_longcontextdeployments.yaml").read_text()
