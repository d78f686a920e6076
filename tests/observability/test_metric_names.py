"""Every metric a shipped dashboard panel or alert rule reads is defined by the component
that exports it, as the real Prometheus parser extracts it from the PromQL: vLLM 0.33's
source, the operator's registry, the GIE endpoint picker's Go source. What no source here
can check is listed in docs/observability.md, and that list is exact."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.observability import prom, sources

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


@pytest.fixture(scope="module")
def used(prometheus) -> dict[str, set[str]]:
    """metric name -> where it is used (dashboard/panel or rule)."""
    out: dict[str, set[str]] = {}
    for q in prom.all_queries():
        for name in prom.metric_names(prometheus, prom.substitute(q.expr, {
                "namespace": "ns", "deployment": "d"})):
            out.setdefault(name, set()).add(f"{q.dashboard}: {q.panel}")
    recorded = {r["record"] for g in prom.rule_groups() for r in g["rules"] if "record" in r}
    for rule, expr in prom.rule_exprs():
        for name in prom.metric_names(prometheus, expr) - recorded:
            out.setdefault(name, set()).add(f"rule {rule}")
    return out


def unchecked_in_doc() -> set[str]:
    """Metric names in the first column of the doc's 'not checked' table."""
    text = DOC.read_text()
    section = text.split("## Metrics whose source is not checked", 1)
    assert len(section) == 2, f"{DOC} lacks the section 'Metrics whose source is not checked'"
    table = section[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \|", table, flags=re.M))


def check(used: dict[str, set[str]], prefixes: tuple[str, ...], defined: dict[str, str]):
    names = {n for n in used if n.startswith(prefixes)}
    assert names, f"no metric starting with {prefixes} is used: the check would prove nothing"
    missing = {n: sorted(used[n]) for n in sorted(names) if n not in defined}
    assert not missing, f"used but not defined by the source: {missing}"


def test_vllm_metrics_are_defined_by_vllm_0_33(used):
    check(used, ("vllm:",), sources.series_names(sources.vllm_metrics(), suffixed=True))


def test_operator_metrics_are_in_its_registry(used):
    operator = {n: u for n, u in used.items() if not n.startswith("longctx_endpoint_")}
    check(operator, ("longctx_",), sources.series_names(sources.operator_metrics(),
                                                       suffixed=True))


def test_endpoint_metrics_are_in_its_registry(used):
    check(used, ("longctx_endpoint_",), sources.series_names(sources.endpoint_metrics(),
                                                             suffixed=True))


def test_picker_metrics_are_defined_by_the_gie_endpoint_picker(used):
    check(used, ("inference_extension_", "inference_pool_", "inference_objective_"),
          sources.series_names(sources.picker_metrics(), suffixed=False))


def test_the_unchecked_metrics_are_exactly_the_documented_ones(used):
    checked = ("vllm:", "longctx_", "inference_extension_", "inference_pool_",
               "inference_objective_")
    unchecked = {n for n in used if not n.startswith(checked)}
    assert unchecked == unchecked_in_doc(), (
        f"docs/observability.md must list exactly the metrics no source here checks: "
        f"used {sorted(unchecked)}, listed {sorted(unchecked_in_doc())}")


def test_the_extraction_finds_a_known_name_of_each_kind():
    # Guards the source readers themselves: one family of each kind from each source.
    vllm = sources.vllm_metrics()
    assert vllm["vllm:time_to_first_token_seconds"] == "histogram"
    assert vllm["vllm:num_requests_running"] == "gauge"
    assert vllm["vllm:nixl_num_failed_transfers"] == "counter"
    assert vllm["vllm:kv_offload_cpu_cache_usage_perc"] == "gauge"     # via metadata objects
    assert vllm["vllm:spec_decode_num_accepted_tokens"] == "counter"   # via a loop
    assert sources.operator_metrics()["longctx_reconciles"] == "counter"
    picker = sources.picker_metrics()
    assert picker["inference_extension_scheduler_attempts_total"] == "counter"
    assert picker["inference_pool_ready_pods"] == "gauge"
