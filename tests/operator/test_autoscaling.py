"""The scaling objects: the capacity rules evaluated by the real promtool over /metrics text
shaped like vLLM 0.33's, and the HPA and KEDA ScaledObject on the CR's /scale."""

from __future__ import annotations

import math
import subprocess

import yaml
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from longctx_engine import contract
from longctx_engine.planner import plan as capacity_plan
from longctx_engine.roles import serving_plan
from longctx_operator.builders import autoscaling
from longctx_operator.builders.engine import pod_monitor
from longctx_operator.desired import desired_objects
from tests.contract.variants import spec_with
from tests.observability import prom, sources

CR = {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
      "metadata": {"name": "glm", "namespace": "llm", "uid": "u-1"}}
# vLLM's per-engine labels (vllm/v1/metrics/loggers.py: labelnames = ["model_name", "engine"]).
VLLM_LABELS = ("model_name", "engine")


def _spec(**changes):
    def edit(d: dict) -> None:
        d["maxContextTokens"] = 262144    # several requests per rank on both tiers
        for role in ("prefill", "decode"):
            d[role].pop("replicas", None)
        d["replicas"] = 2
        d.update(changes)
    return spec_with(edit)


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


def test_the_inputs_are_vllm_033_gauges():
    defined = sources.vllm_metrics()
    for name in (autoscaling.HOST_USAGE, autoscaling.GPU_USAGE, autoscaling.WAITING_INPUT):
        assert defined.get(name) == "gauge", name


def test_capacity_signal_from_recorded_vllm_metrics(tmp_path):
    spec = _spec()
    capacity = capacity_plan(spec)
    host, gpu = autoscaling.slots_per_rank(capacity)
    assert (host, gpu) == (capacity.decode.hisparse["hostPoolRequestsPerRank"],
                           capacity.decode.hisparse["gpuRequestsPerRank"])
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


def test_pod_monitor_gives_prometheus_the_labels_the_rules_select_on():
    monitor = pod_monitor(CR, serving_plan(_spec()))
    assert monitor["spec"]["podTargetLabels"] == [contract.INSTANCE_LABEL,
                                                  contract.COMPONENT_LABEL]


def _autoscaled(**auto):
    return _spec(autoscaling={"minUnits": 1, "maxUnits": 4, **auto})


def test_hpa_targets_the_crs_scale_with_per_unit_averages():
    spec = _autoscaled(metrics={"decodeCapacityPercent": 75, "waitingRequestsPerUnit": 3},
                       scaleDownStabilizationSeconds=60)
    plan, capacity = serving_plan(spec), capacity_plan(spec)
    hpa = autoscaling.horizontal_pod_autoscaler(CR, plan, capacity)
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["name"] == "glm"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "longctx.dev/v1alpha1",
                                             "kind": "LongContextDeployment", "name": "glm"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    host, gpu = autoscaling.slots_per_rank(capacity)
    per_unit = min(host, gpu) * 8 * spec.scaling.decodePerUnit   # 8 decode ranks a pod
    demand, waiting = hpa["spec"]["metrics"]
    assert demand["external"]["metric"] == {
        "name": autoscaling.DEMAND, "selector": {"matchLabels": {"longcontextdeployment": "glm"}}}
    assert demand["external"]["target"] == {
        "type": "AverageValue", "averageValue": autoscaling.quantity(per_unit * 0.75)}
    assert waiting["external"]["target"]["averageValue"] == "3"
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 60}}


def test_quantities_are_canonical():
    assert [autoscaling.quantity(v) for v in (2.0, 1.6, 0.125, 12.0)] == [
        "2", "1600m", "125m", "12"]


def test_keda_scaled_object_queries_the_recorded_series():
    spec = _autoscaled(metrics={"decodeCapacityPercent": 50})
    obj = autoscaling.scaled_object(CR, serving_plan(spec), capacity_plan(spec))
    assert obj["apiVersion"] == "keda.sh/v1alpha1"
    assert obj["spec"]["scaleTargetRef"]["kind"] == "LongContextDeployment"
    (trigger,) = obj["spec"]["triggers"]
    assert trigger["metadata"]["query"] == (
        f'sum({autoscaling.DEMAND}{{namespace="llm", longcontextdeployment="glm"}})')
    assert trigger["metricType"] == "AverageValue"
    per_unit = autoscaling.slots_per_unit(serving_plan(spec), capacity_plan(spec))
    assert float(trigger["metadata"]["threshold"]) == per_unit * 0.5


def test_desired_objects_pick_keda_only_when_asked_and_rules_only_with_the_crd():
    plan = serving_plan(_autoscaled())
    kinds = [o["kind"] for o in desired_objects(CR, plan, with_pod_monitor=True)]
    assert "HorizontalPodAutoscaler" in kinds and "PrometheusRule" not in kinds
    kinds = [o["kind"] for o in desired_objects(CR, plan, with_pod_monitor=True,
                                                with_capacity_rules=True, with_keda=True)]
    assert "ScaledObject" in kinds and "PrometheusRule" in kinds
    assert "HorizontalPodAutoscaler" not in kinds
    plain = [o["kind"] for o in desired_objects(CR, serving_plan(_spec()),
                                                with_pod_monitor=True)]
    assert not {"HorizontalPodAutoscaler", "ScaledObject", "PrometheusRule"} & set(plain)


def statefulset(plan, role: str) -> dict:
    (sts,) = [o for o in desired_objects(CR, plan, with_pod_monitor=False)
              if o["kind"] == "StatefulSet"
              and o["metadata"]["labels"][contract.COMPONENT_LABEL] == role]
    return sts


def _affinity(plan, role: str) -> dict:
    return statefulset(plan, role)["spec"]["template"]["spec"]["affinity"]


def test_statefulsets_follow_the_units():
    plan = serving_plan(_spec(replicas=3, scaling={"prefillPerUnit": 1, "decodePerUnit": 2}))
    assert [statefulset(plan, r)["spec"]["replicas"] for r in ("prefill", "decode")] == [3, 6]


def test_topology_key_pairs_a_decode_pod_with_its_units_prefill_pod():
    plan = serving_plan(_spec(placement={"topologyKey": "example.com/rack"}))
    (term,) = _affinity(plan, "decode")["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": contract.selector_labels("glm", "prefill")},
                    "matchLabelKeys": [contract.PAIRING_LABEL, contract.POD_INDEX_LABEL],
                    "topologyKey": "example.com/rack"}
    assert "podAffinity" not in _affinity(plan, "prefill")
    uneven = serving_plan(_spec(placement={"topologyKey": "example.com/rack"},
                                scaling={"prefillPerUnit": 1, "decodePerUnit": 2}))
    (term,) = _affinity(uneven, "decode")["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["matchLabelKeys"] == [contract.PAIRING_LABEL]
    assert "podAffinity" not in _affinity(serving_plan(_spec()), "decode")
