"""inference-perf, the load generator: its configuration, its trace directory, its process,
and its per-request records read back.

inference-perf replays Weka traces (`data.type: weka_trace_replay`) with
`load.type: trace_session_replay`: each session's turns carry the whole growing conversation
(recorded replies, not the live ones, so the blocks stay aligned), think times are honoured,
subagents run as child sessions. One process runs per concurrency, so the engines' counters
read before and after it belong to that concurrency alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml

from longctx_operator.bench.figures import Request
from longctx_operator.bench.trace import flat_requests

TOOL = "inference-perf"
# The longest a stage may run; a bounded benchmark sets its own, shorter, --timeout.
DEFAULT_STAGE_TIMEOUT_S = 3600


def write_stage_traces(traces: list[dict[str, Any]], concurrency: int, directory: Path) -> int:
    """One JSON file per trace, ids made unique to this concurrency: inference-perf derives
    each block's text from (trace id, hash id), so no concurrency reuses another's cache."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, trace in enumerate(traces):
        copy = dict(trace, id=f"{trace['id']}-c{concurrency}")
        (directory / f"{i:05d}.json").write_text(json.dumps(copy))
    return sum(len(flat_requests(t)) for t in traces)


def tool_config(*, url: str, model: str, tokenizer: str, trace_dir: Path, out_dir: Path,
                concurrency: int, sessions: int, corpus: str | None = None,
                think_time_cap_s: float = 10.0,
                timeout_s: float = DEFAULT_STAGE_TIMEOUT_S) -> dict[str, Any]:
    """inference-perf's configuration for one concurrency: `sessions` sessions, at most
    `concurrency` live at once (a lane takes the next session when its own ends)."""
    data: dict[str, Any] = {
        "type": "weka_trace_replay",
        "weka_trace_replay": {
            "trace_directory": str(trace_dir), "use_static_model": True,
            "static_model_name": model, "default_block_size": 64,
            # AgentX never leaves the system idle for more than 10 s.
            "trace_idle_gap_cap_seconds": think_time_cap_s, "datagen_workers": 1}}
    if corpus:
        data["corpus_file_path"] = corpus
    return {
        "load": {"type": "trace_session_replay",
                 "stages": [{"concurrent_sessions": concurrency, "num_sessions": sessions,
                             "timeout": timeout_s}]},
        "api": {"type": "chat", "streaming": True},
        # ignore_eos with max_tokens = the recorded `out`: every request generates its length.
        "server": {"type": "vllm", "model_name": model, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": tokenizer},
        "data": data,
        "report": {"request_lifecycle": {
            "summary": True, "per_stage": True, "per_request": True,
            "per_request_fields": {"request": False, "response": False, "info": True,
                                   "response_chunks": False, "computed_metrics": True}}},
        "storage": {"local_storage": {"path": str(out_dir)}},
    }


def start(python: Path, config: dict[str, Any], workdir: Path) -> subprocess.Popen:
    """The tool in its own session (Ctrl-C reaches only `longctx bench`, which stops it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "inference-perf.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = open(workdir / "inference-perf.log", "w")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen([str(python.parent / TOOL), "-c", str(path)], cwd=workdir,
                            stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGINT to the tool (it stops its load), then SIGKILL to its group: inference-perf 0.7.0
    does not exit after SIGINT in session replay, so its records of that stage are lost."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _ttft(entry: dict[str, Any], response: dict[str, Any]) -> float | None:
    computed = (entry.get("computed_metrics") or {}).get("time_to_first_token")
    if computed is not None:
        return float(computed)
    times = response.get("output_token_times") or []
    return times[0] - float(entry["start_time"]) if times else None


def record(entry: dict[str, Any]) -> Request:
    """One request of `per_request_lifecycle_metrics.json`: ISL and OSL from the server's
    `usage` (the tool's own count only when the server sent none)."""
    response = (entry.get("info") or {}).get("response_metrics") or {}
    computed = entry.get("computed_metrics") or {}
    usage = response.get("server_usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    error = entry.get("error")
    return Request(
        start=float(entry["start_time"]), end=float(entry["end_time"]),
        ttft=_ttft(entry, response),
        isl=int(usage.get("prompt_tokens") or computed.get("input_tokens") or 0),
        osl=int(usage.get("completion_tokens") or computed.get("output_tokens") or 0),
        cached=details.get("cached_tokens"),
        error=None if not error else (error.get("error_msg") or error.get("error_type")
                                      or json.dumps(error))[:300])


def read_records(out_dir: Path) -> list[Request]:
    """Every request the tool recorded under `out_dir` (none if it wrote nothing)."""
    files = sorted(out_dir.rglob("per_request_lifecycle_metrics.json"))
    entries: list[dict[str, Any]] = []
    for path in files:
        data = json.loads(path.read_text())
        entries.extend(data if isinstance(data, list) else data.get("requests", []))
    return [record(e) for e in entries]


def partial_report(out_dir: Path) -> dict[str, Any] | None:
    """The tool's own slice of an llm-d benchmark report (v0.2) for the stage, if written."""
    files = sorted(out_dir.rglob("inference-perf.partial.stage_*.yaml"))
    return yaml.safe_load(files[0].read_text()) if files else None
