"""The report: the tool's records read back, the prediction beside each point, and the llm-d
document validated by llmd-benchmark-report in the benchmark environment. The two files in
data/ are what inference-perf 0.7.0 wrote for one stage of a real run (trimmed)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from longctx_core.api import spec as api
from longctx_operator.bench import report, tool
from longctx_operator.bench.command import in_bench_env
from longctx_operator.cli import read_manifest
from tests.cluster.controlplane import REPO

DATA = REPO / "tests" / "bench" / "data"


def glm():
    cr = read_manifest(str(REPO / "examples" / "glm-5.3-1m.yaml"))
    return cr, api.load_spec(cr["spec"])


def test_records_take_isl_and_osl_from_the_servers_usage(tmp_path):
    shutil.copy(DATA / "per_request_lifecycle_metrics.json", tmp_path)
    records = tool.read_records(tmp_path)
    raw = json.loads((DATA / "per_request_lifecycle_metrics.json").read_text())
    assert len(records) == len(raw) == 3
    for rec, entry in zip(records, raw):
        usage = entry["info"]["response_metrics"]["server_usage"]
        assert rec.isl == usage["prompt_tokens"] and rec.osl == usage["completion_tokens"]
        times = entry["info"]["response_metrics"]["output_token_times"]
        assert rec.ttft == pytest.approx(times[0] - entry["start_time"])
        assert rec.error is None


def test_the_prediction_is_the_performance_models_at_the_measured_workload():
    _, spec = glm()
    point = {"concurrency": 8, "requests": 10, "failures": 0, "input_tokens": 500_000,
             "output_tokens": 5_000, "cached_input_tokens": 400_000}
    pred = report.predicted(spec, point)
    assert (pred["prompt_tokens"], pred["cached_tokens"], pred["output_tokens"]) == \
        (50_000, 40_000, 500)
    assert report.gpu_count(spec) == 16
    assert pred["throughput_tok_s_per_gpu"] == pytest.approx(
        8 * 50_500 / pred["request_seconds"] / 16)
    assert pred["interactivity_tok_s_per_user"] == pytest.approx(500 / pred["request_seconds"])
    assert 0 < pred["ttft_s"] < pred["request_seconds"]


def point_with_tool_report() -> dict:
    return {"concurrency": 2, "requests": 12, "failures": 0, "input_tokens": 6109,
            "output_tokens": 77, "cached_input_tokens": None,
            "engines": {"prefill": {"prefix_cache_hits": 3584.0}},
            "tool_report": yaml.safe_load(
                (DATA / "inference-perf.partial.stage_0.yaml").read_text())}


def test_the_llm_d_document_validates_and_a_broken_one_does_not(tmp_path):
    cr, spec = glm()
    run = {"target": {"label": "glm"}, "interrupted": False,
           "points": [point_with_tool_report()]}
    full = report.complete(run, cr, spec, {2: {"load": {}}}, {"synthetic": {}})
    doc = full["points"][0]["llmd_benchmark_report"]
    assert doc["scenario"]["load"]["standardized"]["concurrency"] == 2
    assert [c["standardized"]["role"] for c in doc["scenario"]["stack"]] == \
        ["prefill", "decode"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(full))
    checked = in_bench_env("validate", str(path))
    assert checked.returncode == 0, checked.stderr
    del doc["results"]["request_performance"]["aggregate"]["requests"]["total"]
    path.write_text(json.dumps(full))
    checked = in_bench_env("validate", str(path))
    assert checked.returncode == 1 and "total" in checked.stderr


def test_the_plot_is_a_png_and_the_table_has_a_row_per_concurrency(tmp_path):
    cr, spec = glm()
    points = []
    for c, (x, y) in zip((1, 2, 4), ((30.0, 100.0), (20.0, 180.0), (12.0, 300.0))):
        points.append({"concurrency": c, "requests": 8, "failures": 0, "input_tokens": 8000,
                       "output_tokens": 800, "cached_input_tokens": 4000,
                       "throughput_tok_s_per_gpu": y, "interactivity_p90_tok_s_per_user": x,
                       "ttft_p50_s": 0.1, "ttft_p90_s": 0.2, "prefix_cache_hit_rate": 0.5,
                       "nixl_bytes": 1e6})
    full = report.complete({"target": {"label": "glm"}, "interrupted": False,
                            "points": points}, cr, spec, {}, {})
    assert all(p["predicted"]["throughput_tok_s_per_gpu"] > 0 for p in full["points"])
    table = report.table(full)
    assert len(table.strip().splitlines()) == 2 + 3
    path = tmp_path / "r.json"
    path.write_text(json.dumps(full))
    plotted = in_bench_env("plot", str(path), str(tmp_path / "r.png"))
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_prints_the_interactivity_ratio_at_equal_throughput(tmp_path):
    """Two finished reports: B is twice as interactive at every throughput both reach."""
    import subprocess
    import sys

    def fake(label: str, speed: float) -> dict:
        return {"target": {"label": label}, "points": [
            {"concurrency": c, "throughput_tok_s_per_gpu": y,
             "interactivity_p90_tok_s_per_user": speed * 100 / y}
            for c, y in ((1, 100.0), (2, 200.0), (4, 400.0))]}
    paths = []
    for label, speed in (("a", 1.0), ("b", 2.0)):
        paths.append(tmp_path / f"{label}.json")
        paths[-1].write_text(json.dumps(fake(label, speed)))
    proc = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "bench", "sweep",
                           "--report", str(paths[0]), "--report", str(paths[1]),
                           "--out", str(tmp_path / "sweep")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"]
    assert [r["throughput_tok_s_per_gpu"] for r in rows] == [100, 200, 400]
    assert all(r["ratio_b_over_a"] == pytest.approx(2.0) for r in rows)
    assert "| 200.0 | 0.50 | 1.00 | 2.00x |" in proc.stdout
    assert (tmp_path / "sweep" / "sweep.png").exists()
