"""The capacity rules evaluated by the real promtool (tools/build-prometheus.sh, built from
Go sources) over /metrics text shaped like vLLM 0.33's."""

from __future__ import annotations

import math
import subprocess

import yaml
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from longctx_core import contract
from longctx_core.sizing.planner import plan as capacity_plan
from longctx_operator.controller.builders import autoscaling
from tests.contract.variants import spec_with
from tests.observability import prom
from tests.operator.test_autoscaling import CR, _spec

# vLLM's per-engine labels (vllm/v1/metrics/loggers.py: labelnames = ["model_name", "engine"]).
VLLM_LABELS = ("model_name", "engine")


def vllm_metrics_text(values: dict[str, dict[int, float]]) -> str:
    """A decode pod's /metrics: each vLLM gauge by engine rank, as prometheus_client (which
    vLLM uses) renders it."""
    registry = CollectorRegistry()
    for name, by_engine in values.items():
        gauge = Gauge(name, name, VLLM_LABELS, registry=registry)
        for engine, value in by_engine.items():
            gauge.labels(model_name="zai-org/GLM-5.3-FP8", engine=str(engine)).set(value)
    return generate_latest(registry).decode()


def input_series(text: str, pod: str, component: str) -> list[dict[str, str]]:
    """The samples of a /metrics text as Prometheus stores them after a PodMonitor scrape
    (target labels added, podTargetLabels included), for promtool."""
    target = {"namespace": "llm", "pod": pod,
              autoscaling.prometheus_label(contract.INSTANCE_LABEL): "glm",
              autoscaling.prometheus_label(contract.COMPONENT_LABEL): component}
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in {**s.labels, **target}.items())
            out.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value}x8"})
    return out


def run_promtool(tmp_path, rules: list[dict], series: list[dict], tests: list[dict]) -> str:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "capacity", "rules": rules}]}))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": tests}]}))
    proc = subprocess.run([str(prom.bin_dir() / "promtool"), "test", "rules", "test.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_capacity_signal_from_recorded_vllm_metrics(tmp_path):
    spec = _spec()
    capacity = capacity_plan(spec)
    host, gpu = autoscaling.slots_per_rank(capacity)
    assert (host, gpu) == (capacity.decode.hisparse.host_pool_requests,
                           capacity.decode.hisparse.gpu_requests)
    assert 1 < host < gpu, (host, gpu)  # both tiers matter below
    ranks = range(8)
    host_usage = {e: e / 8 for e in ranks}                # rank 0 empty .. rank 7 7/8 full
    gpu_usage = {e: 0.5 if e < 4 else 0.875 for e in ranks}
    waiting = {e: 1 if e in (0, 5) else 0 for e in ranks}
    prefill_waiting = {0: 3}
    series = input_series(vllm_metrics_text({
        autoscaling.HOST_USAGE: host_usage, autoscaling.GPU_USAGE: gpu_usage,
        autoscaling.WAITING_INPUT: waiting}), "glm-decode-0", "decode")
    series += input_series(vllm_metrics_text({autoscaling.WAITING_INPUT: prefill_waiting}),
                           "glm-prefill-0", "prefill")
    # Another deployment's ranks in the same namespace must not count.
    series += [{"series": f'{autoscaling.WAITING_INPUT}{{namespace="llm",pod="x-decode-0",'
                          'app_kubernetes_io_instance="x",app_kubernetes_io_component="decode",'
                          'engine="0"}', "values": "50x8"}]

    free = {e: math.floor(min(host * (1 - host_usage[e]), gpu * (1 - gpu_usage[e])))
            for e in ranks}
    admittable = sum(max(free[e] - waiting[e], 0) for e in ranks)
    demand = sum(min(host, gpu) - free[e] + waiting[e] for e in ranks)
    labels = '{longcontextdeployment="glm", namespace="llm"}'
    run_promtool(tmp_path, autoscaling.capacity_rules(CR, capacity), series, [
        {"expr": autoscaling.ADMITTABLE, "eval_time": "1m",
         "exp_samples": [{"labels": autoscaling.ADMITTABLE + labels, "value": admittable}]},
        {"expr": autoscaling.DEMAND, "eval_time": "1m",
         "exp_samples": [{"labels": autoscaling.DEMAND + labels, "value": demand}]},
        {"expr": autoscaling.WAITING, "eval_time": "1m",
         "exp_samples": [{"labels": autoscaling.WAITING + labels, "value": 5}]},
    ])
    assert 0 < admittable < 8 * min(host, gpu)


def test_without_hisparse_the_gpu_alone_bounds_a_rank(tmp_path):
    def edit(d: dict) -> None:
        d["decode"]["hiSparse"] = {"enabled": False}
        d["maxContextTokens"] = 131072
    capacity = capacity_plan(spec_with(edit))
    host, gpu = autoscaling.slots_per_rank(capacity)
    assert host is None and gpu == capacity.decode.max_concurrent // capacity.decode.layout.ranks
    rules = autoscaling.capacity_rules(CR, capacity)
    assert autoscaling.HOST_USAGE not in rules[0]["expr"]
    series = input_series(vllm_metrics_text({autoscaling.GPU_USAGE: {0: 0.25},
                                             autoscaling.WAITING_INPUT: {0: 0}}),
                          "glm-decode-0", "decode")
    run_promtool(tmp_path, rules, series, [{"expr": autoscaling.ADMITTABLE, "eval_time": "1m",
                                            "exp_samples": [{
        "labels": autoscaling.ADMITTABLE + '{longcontextdeployment="glm", namespace="llm"}',
        "value": math.floor(gpu * 0.75)}]}])


def test_the_rule_group_passes_promtool_check(tmp_path):
    rule = autoscaling.prometheus_rule(CR, capacity_plan(_spec()))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rule["spec"]))
    proc = subprocess.run([str(prom.bin_dir() / "promtool"), "check", "rules",
                           str(tmp_path / "r.yaml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rule["metadata"]["name"] == "glm-capacity"
    assert rule["metadata"]["ownerReferences"][0]["uid"] == "u-1"
