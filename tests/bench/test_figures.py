"""AgentX's definitions, computed by hand on small records."""

from __future__ import annotations

import pytest

from longctx_operator.bench.figures import (Request, counter_deltas, figures,
                                            interactivity_at, percentile,
                                            ratio_at_equal_throughput)


def req(start, end, isl, osl, ttft=0.1, error=None):
    return Request(start=start, end=end, ttft=ttft, isl=isl, osl=osl, cached=None, error=error)


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    assert percentile([5], 90) == 5


def test_throughput_counts_every_prompt_token_and_divides_by_gpus():
    records = [req(0, 2, 1000, 10), req(1, 4, 3000, 20), req(2, 3, 500, 5, error="500")]
    f = figures(records, num_gpus=2)
    # The failed request is not counted; duration is first start to last end of the rest.
    assert f["duration_s"] == 4
    assert f["throughput_tok_s_per_gpu"] == (1000 + 3000 + 10 + 20) / 4 / 2
    assert f["failures"] == 1 and f["requests"] == 3


def test_interactivity_is_one_over_the_p90_of_seconds_per_output_token():
    records = [req(0, i + 1, 100, 10) for i in range(10)]   # E2E 1..10 s, 10 tokens each
    f = figures(records, num_gpus=1)
    slow_tail = percentile([(i + 1) / 10 for i in range(10)], 90)
    assert f["interactivity_p90_tok_s_per_user"] == pytest.approx(1 / slow_tail)
    # The slow tail: below the median user's rate.
    assert f["interactivity_p90_tok_s_per_user"] < f["interactivity_p50_tok_s_per_user"]


def test_ttft_percentiles():
    records = [req(0, 1, 10, 1, ttft=t) for t in (0.1, 0.2, 0.3, 0.4, 1.0)]
    f = figures(records, num_gpus=1)
    assert f["ttft_p50_s"] == pytest.approx(0.3)
    assert f["ttft_p90_s"] == pytest.approx(0.76)


def test_no_successful_request_reports_failures_only():
    f = figures([req(0, 1, 10, 1, error="boom")], num_gpus=1)
    assert f == {"requests": 1, "failures": 1, "num_gpus": 1}
    with pytest.raises(ValueError, match="num_gpus=0"):
        figures([], 0)


def test_hit_rate_and_nixl_bytes_are_counter_deltas():
    before = {"prefix_cache_queries": 100, "prefix_cache_hits": 10, "nixl_bytes": 5}
    after = {"prefix_cache_queries": 300, "prefix_cache_hits": 110, "nixl_bytes": 1005}
    d = counter_deltas(before, after)
    assert d["prefix_cache_hit_rate"] == 0.5 and d["nixl_bytes"] == 1000
    assert counter_deltas(after, after)["prefix_cache_hit_rate"] is None


def test_ratio_at_equal_throughput_interpolates_along_each_curve():
    a = [(10.0, 100.0), (5.0, 200.0), (2.0, 300.0)]       # (interactivity, throughput)
    b = [(20.0, 150.0), (10.0, 350.0)]
    assert interactivity_at(a, 250) == pytest.approx(3.5)
    assert interactivity_at(a, 400) is None
    rows = ratio_at_equal_throughput(a, b)
    assert [r["throughput_tok_s_per_gpu"] for r in rows] == [150, 200, 300]
    at_200 = rows[1]
    assert at_200["interactivity_a"] == 5 and at_200["interactivity_b"] == pytest.approx(17.5)
    assert at_200["ratio_b_over_a"] == pytest.approx(3.5)
