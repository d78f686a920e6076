"""`longctx bench -f CR --render`: the ConfigMap and the Job, checked offline and by the real
API server (`kubectl apply --dry-run=server`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from longctx_core.api import spec as api
from longctx_core.plan.roles import serving_plan
from longctx_operator.bench import job
from longctx_operator.cli import read_manifest
from tests.cluster.controlplane import REPO

CPU_EXAMPLE = REPO / "examples" / "tiny-mla-cpu.yaml"
GPU_EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"


def render_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "longctx_operator.cli", "bench", *args],
                          capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("render")
    proc = render_cli("-f", str(CPU_EXAMPLE), "--render", "--sessions", "2", "--turns", "2",
                      "--concurrency", "1,2", "--word-corpus", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return list(yaml.safe_load_all(proc.stdout))


def test_a_configmap_with_the_trace_and_a_job_that_runs_longctx_bench(rendered):
    configmap, job_obj = rendered
    assert configmap["kind"] == "ConfigMap" and job_obj["kind"] == "Job"
    traces = [json.loads(line) for line in configmap["data"][job.TRACE_KEY].splitlines()]
    assert len(traces) == 2 and all(len(t["requests"]) == 2 for t in traces)
    assert configmap["data"][job.CORPUS_KEY].startswith("w")
    container = job_obj["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[0] == "bench" and container["image"] == job.BENCH_IMAGE

    def flag(name: str) -> list[str]:
        return [args[i + 1] for i, a in enumerate(args) if a == name]
    assert flag("--url") == ["http://tiny-router.default.svc:8080"]
    assert flag("--model") == ["tiny-mla"] and flag("--tokenizer") == [job.MODEL_DIR]
    assert flag("--engine-metrics") == ["prefill=http://tiny-prefill.default.svc:8000",
                                        "decode=http://tiny-decode.default.svc:8000"]
    assert flag("--concurrency") == ["1,2"]
    assert flag("-f") == [f"{job.BENCH_DIR}/{job.CR_KEY}"]
    deployment = yaml.safe_load(configmap["data"][job.CR_KEY])
    assert deployment["spec"] == read_manifest(str(CPU_EXAMPLE))["spec"]
    assert "--emit-json" in args
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[job.MODEL_DIR]["subPath"] == "mla"
    volumes = {v["name"]: v for v in job_obj["spec"]["template"]["spec"]["volumes"]}
    assert volumes["bench"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "tiny-models"


def test_the_job_runs_the_same_command_line_here():
    """The Job's arguments parse with this CLI's parser (nothing the image cannot run)."""
    from longctx_operator.cli import build_parser
    cr = read_manifest(str(CPU_EXAMPLE))
    plan = serving_plan(api.load_spec(cr["spec"]), cr["metadata"]["name"])
    _, job_obj = job.render(cr, plan, traces_jsonl="{}\n", corpus=None, bench_args=[])
    args = build_parser().parse_args(job_obj["spec"]["template"]["spec"]["containers"][0]
                                     ["args"])
    assert args.url and args.trace and args.emit_json and args.engine_metrics


def test_rendering_writes_no_file(tmp_path):
    """The trace travels in the ConfigMap: --render leaves the working directory as it was."""
    proc = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "bench", "-f",
                           str(CPU_EXAMPLE), "--render", "--sessions", "1"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert job.TRACE_KEY in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_llm_d_routing_needs_the_gateway_address(tmp_path):
    proc = render_cli("-f", str(GPU_EXAMPLE), "--render", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "spec.router.type" in proc.stderr and "--url" in proc.stderr
    proc = render_cli("-f", str(GPU_EXAMPLE), "--render", "--out", str(tmp_path),
                      "--url", "http://gw.gateway.svc:80")
    assert proc.returncode == 0, proc.stderr
    _, job_obj = yaml.safe_load_all(proc.stdout)
    args = job_obj["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--url") + 1] == "http://gw.gateway.svc:80"
    configmap, _ = yaml.safe_load_all(proc.stdout)
    assert yaml.safe_load(configmap["data"][job.CR_KEY])["metadata"]["name"] == "glm"


@pytest.mark.cluster
def test_the_api_server_accepts_them(rendered, cluster):
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                           input=yaml.safe_dump_all(rendered), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == 2, proc.stdout
