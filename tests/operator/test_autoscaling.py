"""The scaling objects: the HPA and KEDA ScaledObject on the CR's /scale, and what the
capacity rules read. promtool's evaluation of the rules is in
tests/observability/test_capacity_rules.py (it builds Prometheus from Go sources)."""

from __future__ import annotations

from longctx_core import contract
from longctx_core.sizing.planner import plan as capacity_plan
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.builders import autoscaling
from longctx_operator.controller.builders.engine import pod_monitor
from longctx_operator.controller.desired import desired_objects
from tests.contract.variants import spec_with
from tests.observability import sources

CR = {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
      "metadata": {"name": "glm", "namespace": "llm", "uid": "u-1"}}


def _spec(**changes):
    def edit(d: dict) -> None:
        d["maxContextTokens"] = 262144    # several requests per rank on both tiers
        for role in ("prefill", "decode"):
            d[role].pop("replicas", None)
        d["replicas"] = 2
        d.update(changes)
    return spec_with(edit)


def test_the_inputs_are_vllm_033_gauges():
    defined = sources.vllm_metrics()
    for name in (autoscaling.HOST_USAGE, autoscaling.GPU_USAGE, autoscaling.WAITING_INPUT):
        assert defined.get(name) == "gauge", name


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
    kinds = [o["kind"] for o in desired_objects(CR, plan, router_for(plan.spec), with_pod_monitor=True)]
    assert "HorizontalPodAutoscaler" in kinds and "PrometheusRule" not in kinds
    kinds = [o["kind"] for o in desired_objects(CR, plan, router_for(plan.spec), with_pod_monitor=True,
                                                with_capacity_rules=True, with_keda=True)]
    assert "ScaledObject" in kinds and "PrometheusRule" in kinds
    assert "HorizontalPodAutoscaler" not in kinds
    plain_plan = serving_plan(_spec())
    plain = [o["kind"] for o in desired_objects(CR, plain_plan, router_for(plain_plan.spec),
                                                with_pod_monitor=True)]
    assert not {"HorizontalPodAutoscaler", "ScaledObject", "PrometheusRule"} & set(plain)


def statefulset(plan, role: str) -> dict:
    (sts,) = [o for o in desired_objects(CR, plan, router_for(plan.spec), with_pod_monitor=False)
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
