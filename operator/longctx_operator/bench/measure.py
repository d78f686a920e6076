"""One benchmark: the same trace at each concurrency, the tool sending every request.

Per concurrency: the engines' counters, inference-perf over a fresh copy of the trace, the
counters again, the figures from the tool's per-request records. Progress lines come from
the engines' counters every few seconds; SIGINT stops the tool and the report keeps every
concurrency measured so far (the interrupted one with the requests it finished).
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from longctx_operator.bench import engine_metrics, tool
from longctx_operator.bench.figures import counter_deltas, figures


@dataclass
class Target:
    """Where requests go and what is measured there."""

    url: str                       # the OpenAI-compatible endpoint (the router)
    model: str                     # served model name
    tokenizer: str                 # a path or name the tool loads the model's tokenizer from
    num_gpus: int                  # from the deployment's plan (CPU: engine ranks)
    engines: dict[str, list[str]] = field(default_factory=dict)   # role -> metrics URLs
    corpus: str | None = None      # prompt text the tool samples blocks from
    label: str = "deployment"


class Interrupted:
    """SIGINT during a run: set once, read by the loop."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.seen = True


def _progress_line(target: Target, concurrency: int, start: dict[str, float],
                   last: dict[str, float], now: dict[str, float], seconds: float) -> str:
    done = now["requests_done"] - start["requests_done"]
    tokens = sum(now[k] - last[k] for k in ("prompt_tokens", "generation_tokens"))
    return (f"[bench {target.label}] concurrency {concurrency}: {done:.0f} requests done, "
            f"{tokens / seconds:.0f} tok/s now")


def _progress_counters(target: Target) -> dict[str, float]:
    """Requests finish on decode (P/D) or on the only role there is."""
    urls = target.engines.get("decode") or [u for us in target.engines.values() for u in us]
    return engine_metrics.scrape(urls, timeout=5)


def run_concurrency(target: Target, traces: list[dict[str, Any]], concurrency: int,
                    python: Path, workdir: Path, interrupted: Interrupted,
                    say: Callable[[str], None], timeout_s: float,
                    progress_every_s: float = 5.0) -> dict[str, Any]:
    stage = workdir / f"concurrency-{concurrency}"
    expected = tool.write_stage_traces(traces, concurrency, stage / "traces")
    config = tool.tool_config(url=target.url, model=target.model, tokenizer=target.tokenizer,
                              trace_dir=stage / "traces", out_dir=stage / "results",
                              concurrency=concurrency, sessions=len(traces),
                              corpus=target.corpus, timeout_s=timeout_s)
    before = engine_metrics.by_role(target.engines)
    proc = tool.start(python, config, stage)
    started = last_at = time.monotonic()
    first = last = _progress_counters(target) if target.engines else None
    while proc.poll() is None:
        if interrupted.seen or time.monotonic() - started > timeout_s + 60:
            tool.stop(proc)
            break
        time.sleep(0.5)
        if first is not None and time.monotonic() - last_at >= progress_every_s:
            try:
                now = _progress_counters(target)
            except OSError:   # progress is best effort; the before/after scrapes are not
                continue
            say(_progress_line(target, concurrency, first, last, now, time.monotonic() - last_at))
            last, last_at = now, time.monotonic()
    after = engine_metrics.by_role(target.engines)
    records = tool.read_records(stage / "results")
    point: dict[str, Any] = {"concurrency": concurrency, "sessions": len(traces),
                             "requests_planned": expected,
                             "complete": not interrupted.seen and proc.returncode == 0,
                             "tool_exit_code": proc.returncode,
                             **figures(records, target.num_gpus)}
    per_role = {role: counter_deltas(before[role], after[role]) for role in after}
    # Prompts are computed where prefill runs: that role's cache is the one that counts.
    headline = per_role.get("prefill") or (next(iter(per_role.values())) if per_role else {})
    point["prefix_cache_hit_rate"] = headline.get("prefix_cache_hit_rate")
    point["nixl_bytes"] = sum(r["nixl_bytes"] for r in per_role.values())
    point["engines"] = per_role
    point["records"] = [r.__dict__ for r in records]
    point["tool_report"] = tool.partial_report(stage / "results")
    if not records:
        point["tool_log_tail"] = (stage / "inference-perf.log").read_text()[-2000:]
    return point


def run(target: Target, traces: list[dict[str, Any]], concurrencies: list[int], python: Path,
        workdir: Path, say: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
        timeout_s: float = tool.DEFAULT_STAGE_TIMEOUT_S,
        progress_every_s: float = 5.0) -> dict[str, Any]:
    """Every concurrency in order; stops early (interrupted: true) on SIGINT."""
    interrupted = Interrupted()
    previous = signal.signal(signal.SIGINT, interrupted)
    points = []
    try:
        for concurrency in concurrencies:
            say(f"[bench {target.label}] concurrency {concurrency}: {len(traces)} sessions")
            point = run_concurrency(target, traces, concurrency, python, workdir,
                                    interrupted, say, timeout_s, progress_every_s)
            points.append(point)
            say(f"[bench {target.label}] concurrency {concurrency}: "
                f"{point['requests']} requests, {point['failures']} failed, "
                f"{point.get('throughput_tok_s_per_gpu', 0):.1f} tok/s/GPU, P90 interactivity "
                f"{point.get('interactivity_p90_tok_s_per_user', 0):.2f} tok/s/user")
            if interrupted.seen:
                say(f"[bench {target.label}] interrupted: partial report")
                break
    finally:
        signal.signal(signal.SIGINT, previous)
    return {"target": {"label": target.label, "url": target.url, "model": target.model,
                       "num_gpus": target.num_gpus},
            "interrupted": interrupted.seen, "points": points}
