"""The seed's figures from per-request records, with AgentX's definitions.

- throughput per GPU = (sum of ISL + sum of OSL) / duration / GPUs, where ISL is the
  server's `usage.prompt_tokens` (cached prefix tokens included: logical tokens) and the
  duration runs from the first request's start to the last one's end;
- interactivity = 1 / P90(E2E latency / OSL) over requests: the slow tail of per-user
  output tokens per second (E2E-normalized), the x axis of the seed's Figure 5;
- TTFT p50 and p90; failures are requests that ended in an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INTERACTIVITY_PERCENTILE = 90


@dataclass(frozen=True)
class Request:
    start: float          # seconds, one clock for all records of a run
    end: float
    ttft: float | None
    isl: int              # usage.prompt_tokens (cached tokens included)
    osl: int              # usage.completion_tokens
    cached: int | None    # usage.prompt_tokens_details.cached_tokens, when the server says
    error: str | None


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def figures(requests: list[Request], num_gpus: int) -> dict[str, Any]:
    """One concurrency's figures; `num_gpus` is the deployment's GPU count from its plan."""
    if num_gpus < 1:
        raise ValueError(f"num_gpus={num_gpus}: must be >= 1")
    ok = [r for r in requests if r.error is None and r.osl > 0]
    failed = [r for r in requests if r.error is not None]
    out: dict[str, Any] = {"requests": len(requests), "failures": len(failed),
                           "num_gpus": num_gpus}
    if not ok:
        return out
    duration = max(r.end for r in ok) - min(r.start for r in ok)
    isl = sum(r.isl for r in ok)
    osl = sum(r.osl for r in ok)
    cached = [r.cached for r in ok if r.cached is not None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    normalized = [(r.end - r.start) / r.osl for r in ok]
    out.update({
        "duration_s": duration,
        "input_tokens": isl,
        "output_tokens": osl,
        "cached_input_tokens": sum(cached) if cached else None,
        "throughput_tok_s_per_gpu": (isl + osl) / duration / num_gpus,
        "output_tok_s_per_gpu": osl / duration / num_gpus,
        "interactivity_p90_tok_s_per_user": 1.0 / percentile(normalized,
                                                             INTERACTIVITY_PERCENTILE),
        "interactivity_p50_tok_s_per_user": 1.0 / percentile(normalized, 50),
        "ttft_p50_s": percentile(ttfts, 50) if ttfts else None,
        "ttft_p90_s": percentile(ttfts, 90) if ttfts else None,
    })
    return out


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Engine counters over one concurrency: the prefix-cache hit rate (hits over queried
    tokens, vLLM's `prefix_cache_queries`/`hits`) and the bytes NIXL moved."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    queries = delta.get("prefix_cache_queries", 0.0)
    return {"prompt_tokens": delta.get("prompt_tokens", 0.0),
            "requests_done": delta.get("requests_done", 0.0),
            "prefix_cache_queries": queries,
            "prefix_cache_hits": delta.get("prefix_cache_hits", 0.0),
            "prefix_cache_hit_rate": delta.get("prefix_cache_hits", 0.0) / queries
            if queries else None,
            "nixl_bytes": delta.get("nixl_bytes", 0.0),
            "nixl_transfers": delta.get("nixl_transfers", 0.0),
            "external_kv_tokens": delta.get("external_kv_tokens", 0.0)}


def interactivity_at(curve: list[tuple[float, float]], throughput: float) -> float | None:
    """Interactivity where a measured curve of (interactivity, throughput) points reaches
    `throughput`, linearly interpolated between neighbours; None outside the curve."""
    points = sorted(curve, key=lambda p: p[1])
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y0 <= throughput <= y1:
            return x0 if y1 == y0 else x0 + (x1 - x0) * (throughput - y0) / (y1 - y0)
    if len(points) == 1 and points[0][1] == throughput:
        return points[0][0]
    return None


def ratio_at_equal_throughput(a: list[tuple[float, float]], b: list[tuple[float, float]]
                              ) -> list[dict[str, float]]:
    """B's interactivity over A's at each throughput both curves reach (A's and B's
    measured throughputs in their common range)."""
    if not a or not b:
        return []
    low = max(min(y for _, y in a), min(y for _, y in b))
    high = min(max(y for _, y in a), max(y for _, y in b))
    rows = []
    for y in sorted({y for _, y in a + b if low <= y <= high}):
        ia, ib = interactivity_at(a, y), interactivity_at(b, y)
        if ia and ib:
            rows.append({"throughput_tok_s_per_gpu": y, "interactivity_a": ia,
                         "interactivity_b": ib, "ratio_b_over_a": ib / ia})
    return rows
