"""The `longctx` CLI: plan, render and crd work offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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
    engine = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"].startswith("glm-engine-"))
    assert set(engine["data"]) == {"prefill.json", "decode.json"}


def test_bad_spec_names_the_field():
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["spec"]["decode"]["replicaz"] = 1
    out = longctx("render", "-f", "-", stdin=yaml.safe_dump(cr))
    assert out.returncode == 2
    assert "spec.decode" in out.stderr and "replicaz" in out.stderr


def test_render_writes_no_yaml_aliases():
    out = longctx("render", "-f", str(EXAMPLE))
    assert "&id" not in out.stdout and "*id" not in out.stdout


def test_crd_command_prints_the_committed_crd():
    out = longctx("crd")
    assert out.stdout == (REPO / "crds" / "longctx.dev_longcontextdeployments.yaml").read_text()


def test_plain_plan_is_the_capacity_table_plus_performance_and_threshold_lines():
    from longctx_core.api import spec as api
    from longctx_core.sizing import performance, planner
    from longctx_core.sizing.decider import disaggregation_report
    from longctx_core.sizing.plan_report import (render_decode_loss, render_disaggregation,
                                                 render_performance_line, render_table)

    spec = api.load_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    from longctx_operator.controller.routers import router_for

    perf = performance.summary_at_max_context(spec)
    expected = render_table(planner.plan(spec)) + render_performance_line(perf) + \
        render_decode_loss(perf) + render_disaggregation(
        disaggregation_report(spec), spec.router.type, router_for(spec).decides_disaggregation)
    out = longctx("plan", "-f", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"
    assert out.stdout.count("Performance") == 1
    assert "Decode loss at 1,048,576 tokens" in out.stdout


def test_plan_with_a_workload_prints_and_emits_the_performance(tmp_path):
    args = ("plan", "-f", str(EXAMPLE), "--prompt-tokens", "131072", "--cached-tokens", "65536",
            "--output-tokens", "1000", "--concurrency", "64")
    table = longctx(*args, "--compare")
    assert table.returncode == 0, table.stderr
    for text in ("DCP all-gather within it", "KV transfer (NIXL)", "Tokens/s per user",
                 "DP8 prefill + offload", "offload-only decode"):
        assert text in table.stdout, text
    perf = json.loads(longctx(*args, "-o", "json").stdout)["performance"]
    assert perf["promptTokens"] == 131072 and perf["concurrency"] == 64
    assert {"seconds", "bound", "dcpOverheadPercent"} <= set(perf["prefill"])
    assert {"stepSeconds", "tokensPerSecondPerUser", "tokensPerSecondPerGpu", "bound"} <= set(
        perf["decode"])
    loss = perf["decodeLoss"]       # at the end of the 1,000-token answer
    assert (loss["contextTokens"], loss["generatedTokens"]) == (132072, 1000)
    assert "Decode loss at 132,072 tokens (1,000 generated)" in table.stdout
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"name": "slow", "hbmBytesPerS": 1e12}))
    slower = json.loads(longctx(*args, "-o", "json", "--hardware", str(slow)).stdout)
    assert slower["performance"]["decode"]["stepSeconds"] > perf["decode"]["stepSeconds"]


@pytest.mark.parametrize("args, text", [
    (("--cached-tokens", "10"), "--cached-tokens needs --prompt-tokens"),
    (("--prompt-tokens", "100", "--cached-tokens", "100"), "--cached-tokens"),
    (("--hardware", "/nonexistent.json"), "--hardware /nonexistent.json"),
])
def test_plan_refuses_a_bad_workload_naming_the_flag(args, text):
    out = longctx("plan", "-f", str(EXAMPLE), *args)
    assert out.returncode == 2
    assert text in out.stderr
