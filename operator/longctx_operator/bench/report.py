"""The benchmark report: per concurrency the seed's figures, `longctx plan`'s prediction
for the same layout and workload, and an llm-d benchmark report (v0.2) document.

The llm-d document is inference-perf's own slice of it (run, results) with the scenario
added here (the deployment's engines as stack components, the load): a file llm-d's tools
read. Its validation, like the plot, runs in the benchmark environment (bench_env_tasks.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from longctx_core.sizing import performance
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.planner import role_layouts

REPORT_VERSION = "longctx.dev/bench/v1"


def gpu_count(spec: LongContextDeploymentSpec) -> int:
    """GPUs of the serving layout (on the CPU platform each engine rank counts as one)."""
    return sum(layout.replicas * layout.gpusPerPod for layout in role_layouts(spec))


def predicted(spec: LongContextDeploymentSpec, point: dict[str, Any]) -> dict[str, Any] | None:
    """The performance model at a measured point's workload: its mean prompt, cached share,
    output and concurrency. Closed loop: each of `concurrency` users sends its next request
    when the last one ends, so throughput = concurrency x (ISL + OSL) / request time."""
    requests = point["requests"] - point["failures"]
    if requests < 1 or "input_tokens" not in point:
        return None
    isl = round(point["input_tokens"] / requests)
    osl = max(1, round(point["output_tokens"] / requests))
    # The server's cached-token count when it sends one, else the prefill engines' hits.
    cached_total = point.get("cached_input_tokens")
    if cached_total is None:
        cached_total = (point.get("engines", {}).get("prefill") or {}).get(
            "prefix_cache_hits", 0)
    cached = round(cached_total / requests)
    try:
        perf = performance.predict(spec, performance.Workload(
            isl, min(cached, isl), osl, point["concurrency"]))
    except ValueError as exc:
        return {"error": str(exc)}
    if perf is None or not perf.get("requestSeconds"):
        return None
    seconds = perf["requestSeconds"]
    return {"hardware": perf["hardware"], "prompt_tokens": isl, "cached_tokens": cached,
            "output_tokens": osl, "request_seconds": seconds, "ttft_s": perf["ttftSeconds"],
            "interactivity_tok_s_per_user": osl / seconds,
            "throughput_tok_s_per_gpu": point["concurrency"] * (isl + osl) / seconds
            / gpu_count(spec)}


def _engine_component(cr: dict[str, Any], role: str, layout: Any) -> dict[str, Any]:
    spec = cr["spec"]
    native = spec.get(role, {})
    group = layout.dataParallel * layout.gpus_per_rank
    return {"metadata": {"schema_version": "0.0.1",
                         "label": f"{cr['metadata']['name']}-{role}",
                         "cfg_id": hashlib.sha256(json.dumps(native, sort_keys=True)
                                                  .encode()).hexdigest()[:32]},
            "standardized": {"kind": "inference_engine", "tool": "vllm",
                             "tool_version": str(spec.get("engine", {}).get("image", "")),
                             "role": role, "replicas": layout.replicas,
                             "model": {"name": spec["model"].get("servedName")
                                       or spec["model"]["name"]},
                             "accelerator": {
                                 "model": spec.get("engine", {}).get("platform", "gpu"),
                                 "count": layout.replicas * layout.gpusPerPod,
                                 "parallelism": {
                                     "tp": layout.tensorParallel, "pp": layout.pipelineParallel,
                                     "dp": layout.dataParallel,
                                     "dp_local": layout.ranks_per_pod,
                                     "workers": layout.pods_per_group,
                                     "ep": group if layout.expertParallel else 1}}},
            "native": {"config": native}}


def llmd_report(point: dict[str, Any], cr: dict[str, Any] | None,
                spec: LongContextDeploymentSpec | None, tool_config: dict[str, Any]
                ) -> dict[str, Any] | None:
    """inference-perf's report slice for the stage, completed with the scenario."""
    doc = point.get("tool_report")
    if not doc:
        return None
    doc = dict(doc)
    requests = max(1, point["requests"] - point["failures"])

    def length(total: int) -> dict[str, Any]:
        return {"distribution": "other", "value": round(total / requests, 1)}
    stack = []
    if cr is not None and spec is not None:
        stack = [_engine_component(cr, role, layout)
                 for role, layout in zip(("prefill", "decode"), role_layouts(spec))]
    doc["scenario"] = {
        **({"stack": stack} if stack else {}),
        "load": {"metadata": {"schema_version": "0.0.1"},
                 "standardized": {"tool": "inference-perf", "tool_version": "0.7.0",
                                  "stage": 0, "concurrency": point["concurrency"],
                                  "source": "sampled",
                                  "input_seq_len": length(point.get("input_tokens", 0)),
                                  "output_seq_len": length(point.get("output_tokens", 0)),
                                  "multi_turn": {"enabled": True}},
                 "native": {"config": tool_config}}}
    return doc


SUMMARY_KEYS = ("concurrency", "requests", "failures", "throughput_tok_s_per_gpu",
                "interactivity_p90_tok_s_per_user", "ttft_p50_s", "ttft_p90_s",
                "prefix_cache_hit_rate", "nixl_bytes")


def table(report: dict[str, Any]) -> str:
    """The per-concurrency figures as a Markdown table (what docs/bench.md shows)."""
    head = ["conc.", "requests", "failed", "tok/s/GPU (logical)", "P90 interactivity tok/s/user",
            "TTFT p50 s", "TTFT p90 s", "prefix hit rate", "NIXL MB", "predicted tok/s/GPU",
            "predicted tok/s/user"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]

    def fmt(value: Any, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) \
            else str(value)
    for p in report["points"]:
        pred = p.get("predicted") or {}
        rows.append("| " + " | ".join([
            str(p["concurrency"]), str(p["requests"]), str(p["failures"]),
            fmt(p.get("throughput_tok_s_per_gpu"), 1),
            fmt(p.get("interactivity_p90_tok_s_per_user")), fmt(p.get("ttft_p50_s"), 3),
            fmt(p.get("ttft_p90_s"), 3), fmt(p.get("prefix_cache_hit_rate"), 3),
            fmt(p["nixl_bytes"] / 1e6 if p.get("nixl_bytes") is not None else None, 1),
            fmt(pred.get("throughput_tok_s_per_gpu"), 1),
            fmt(pred.get("interactivity_tok_s_per_user"))]) + " |")
    return "\n".join(rows) + "\n"


def complete(run: dict[str, Any], cr: dict[str, Any] | None,
             spec: LongContextDeploymentSpec | None, tool_configs: dict[int, dict[str, Any]],
             trace_source: dict[str, Any]) -> dict[str, Any]:
    """The runner's output with predictions and llm-d documents added."""
    for point in run["points"]:
        point["predicted"] = predicted(spec, point) if spec is not None else None
        point["llmd_benchmark_report"] = llmd_report(
            point, cr, spec, tool_configs.get(point["concurrency"], {}))
        point.pop("tool_report", None)
    return {"version": REPORT_VERSION, "trace": trace_source,
            "deployment": None if cr is None else {
                "name": cr["metadata"]["name"],
                "namespace": cr["metadata"].get("namespace", "default")},
            **run}
