"""Pure builders of the scaling objects: the capacity signal as Prometheus recording rules,
and the autoscaler on the CR's /scale (an autoscaling/v2 HPA, or a KEDA ScaledObject).

The capacity signal: how many more max-context requests the decode role can admit. Each
decode engine rank holds at most `hostPoolRequestsPerRank` max-context requests in its
HiSparse host pool and `gpuRequestsPerRank` on its GPU (indexer keys plus the hot buffer),
both from the capacity plan; vLLM 0.33 reports how full each is and how many requests
wait, per engine rank:
- `vllm:hisparse_host_cache_usage_perc` (gauge, 0..1; evictable cached blocks count as
  free), vllm/distributed/kv_transfer/kv_connector/v1/hisparse/stats.py;
- `vllm:kv_cache_usage_perc` (gauge, 0..1, the GPU block pool), vllm/v1/metrics/loggers.py;
- `vllm:num_requests_waiting` (gauge), vllm/v1/metrics/loggers.py.
Per rank: free = floor(min(host x (1 - host usage), gpu x (1 - GPU usage))), admittable =
max(free - waiting, 0), demand = slots - free + waiting with slots = min(host, gpu).

The rules are written per deployment because the slots per rank are the plan's numbers
for its spec; they live in a PrometheusRule the deployment owns, so they change with the
spec and go away with the CR. Prometheus already holds the inputs (the PodMonitor scrapes
every rank), no component connects to a pod, and an autoscaler reads Prometheus anyway.
"""

from __future__ import annotations

import re
from typing import Any

from longctx_core import contract
from longctx_core.sizing.planner import CapacityPlan
from longctx_core.plan.roles import ServingPlan
from longctx_operator import kinds

ADMITTABLE = "longctx:decode_admittable_requests"   # the capacity signal
DEMAND = "longctx:decode_demand_requests"           # slots in use plus waiting requests
WAITING = "longctx:waiting_requests"                # both roles' queues
RECORDED = (ADMITTABLE, DEMAND, WAITING)
# The label every recorded series carries: the CR's name.
DEPLOYMENT_LABEL = "longcontextdeployment"
# How often Prometheus evaluates the rules; the HPA reads at most every 15 s by default.
EVALUATION_INTERVAL = "15s"

HOST_USAGE = "vllm:hisparse_host_cache_usage_perc"
GPU_USAGE = "vllm:kv_cache_usage_perc"
WAITING_INPUT = "vllm:num_requests_waiting"

HPA_KIND = kinds.KIND_BY_NAME["HorizontalPodAutoscaler"]
SCALED_OBJECT_KIND = kinds.KIND_BY_NAME["ScaledObject"]
RULE_KIND = kinds.KIND_BY_NAME["PrometheusRule"]


def prometheus_label(pod_label: str) -> str:
    """The label name a PodMonitor's podTargetLabels gives a pod label in Prometheus."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def _meta(cr: dict[str, Any], name: str) -> dict[str, Any]:
    return {"name": name, "namespace": cr["metadata"]["namespace"],
            "labels": contract.labels(cr["metadata"]["name"], contract.MONITORING_COMPONENT),
            "ownerReferences": [contract.owner_reference(cr)]}


# ---------------------------------------------------------------- the capacity signal


def slots_per_rank(capacity: CapacityPlan) -> tuple[int | None, int]:
    """Max-context requests one decode rank holds: (host pool, GPU); host is None without
    HiSparse, where the GPU's KV alone bounds a rank."""
    decode = capacity.decode
    hisparse = decode.hisparse
    if hisparse is not None and hisparse.enabled:
        return hisparse.host_pool_requests, hisparse.gpu_requests
    kv = decode.budget.kv or 0
    return None, kv // decode.kv_bytes_per_gpu if decode.kv_bytes_per_gpu else 0


def slots_per_unit(plan: ServingPlan, capacity: CapacityPlan) -> int:
    host, gpu = slots_per_rank(capacity)
    per_rank = gpu if host is None else min(host, gpu)
    return per_rank * plan.decode.layout.ranks_per_pod * plan.spec.scaling.decodePerUnit


def _selector(cr: dict[str, Any], component: str | None = None) -> str:
    labels = {"namespace": cr["metadata"]["namespace"],
              prometheus_label(contract.INSTANCE_LABEL): cr["metadata"]["name"]}
    if component:
        labels[prometheus_label(contract.COMPONENT_LABEL)] = component
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def capacity_rules(cr: dict[str, Any], capacity: CapacityPlan) -> list[dict[str, Any]]:
    """The recording rules of one deployment (a Prometheus rule group's `rules`)."""
    host, gpu = slots_per_rank(capacity)
    decode = _selector(cr, "decode")
    gpu_free = f"{gpu} * (1 - {GPU_USAGE}{decode})"
    if host is None:
        free, slots = f"floor({gpu_free})", gpu
    else:
        host_free = f"{host} * (1 - {HOST_USAGE}{decode})"
        # The smaller of the two per rank: `a < b or b` keeps a where it is smaller, else b.
        free, slots = f"floor(({host_free}) < ({gpu_free}) or ({gpu_free}))", min(host, gpu)
    waiting = f"{WAITING_INPUT}{decode}"
    labels = {DEPLOYMENT_LABEL: cr["metadata"]["name"]}
    return [
        {"record": ADMITTABLE, "labels": labels,
         "expr": f"sum by (namespace) (clamp_min({free} - {waiting}, 0))"},
        {"record": DEMAND, "labels": labels,
         "expr": f"sum by (namespace) ({slots} - {free} + {waiting})"},
        {"record": WAITING, "labels": labels,
         "expr": f"sum by (namespace) ({WAITING_INPUT}{_selector(cr)})"},
    ]


def prometheus_rule(cr: dict[str, Any], capacity: CapacityPlan) -> dict[str, Any]:
    name = cr["metadata"]["name"]
    return {
        "apiVersion": RULE_KIND.api_version, "kind": RULE_KIND.kind,
        "metadata": _meta(cr, contract.capacity_rule(name)),
        "spec": {"groups": [{"name": f"longctx-capacity-{cr['metadata']['namespace']}-{name}",
                             "interval": EVALUATION_INTERVAL,
                             "rules": capacity_rules(cr, capacity)}]},
    }


# ---------------------------------------------------------------- the autoscaler


def quantity(value: float) -> str:
    """A Kubernetes quantity in the API server's canonical form ("2", "1600m"), so that the
    live object compares equal to the desired one."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def targets(plan: ServingPlan, capacity: CapacityPlan) -> list[tuple[str, float]]:
    """(recorded series, average value per unit) of each signal the spec turns on."""
    metrics = plan.spec.autoscaling.metrics
    out: list[tuple[str, float]] = []
    if metrics.decodeCapacityPercent > 0:
        out.append((DEMAND, slots_per_unit(plan, capacity)
                    * metrics.decodeCapacityPercent / 100))
    if metrics.waitingRequestsPerUnit is not None:
        out.append((WAITING, float(metrics.waitingRequestsPerUnit)))
    return out


def _scale_target(cr: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
            "name": cr["metadata"]["name"]}


def _behavior(plan: ServingPlan) -> dict[str, Any]:
    return {"scaleDown": {"stabilizationWindowSeconds":
                          plan.spec.autoscaling.scaleDownStabilizationSeconds}}


def horizontal_pod_autoscaler(cr: dict[str, Any], plan: ServingPlan,
                              capacity: CapacityPlan) -> dict[str, Any]:
    """An HPA on External metrics: the recorded series, as a metrics adapter (e.g.
    prometheus-adapter's externalRules) serves them, selected by the deployment label."""
    auto = plan.spec.autoscaling
    name = cr["metadata"]["name"]
    return {
        "apiVersion": HPA_KIND.api_version, "kind": HPA_KIND.kind,
        "metadata": _meta(cr, contract.autoscaler(name)),
        "spec": {
            "scaleTargetRef": _scale_target(cr),
            "minReplicas": auto.minUnits, "maxReplicas": auto.maxUnits,
            "metrics": [{"type": "External", "external": {
                "metric": {"name": series,
                           "selector": {"matchLabels": {DEPLOYMENT_LABEL: name}}},
                "target": {"type": "AverageValue", "averageValue": quantity(value)}}}
                for series, value in targets(plan, capacity)],
            "behavior": _behavior(plan),
        },
    }


def scaled_object(cr: dict[str, Any], plan: ServingPlan,
                  capacity: CapacityPlan) -> dict[str, Any]:
    """A KEDA ScaledObject with a Prometheus trigger per signal (KEDA makes the HPA)."""
    auto = plan.spec.autoscaling
    meta = cr["metadata"]
    selector = f'{{namespace="{meta["namespace"]}", {DEPLOYMENT_LABEL}="{meta["name"]}"}}'
    return {
        "apiVersion": SCALED_OBJECT_KIND.api_version, "kind": SCALED_OBJECT_KIND.kind,
        "metadata": _meta(cr, contract.autoscaler(meta["name"])),
        "spec": {
            "scaleTargetRef": _scale_target(cr),
            "minReplicaCount": auto.minUnits, "maxReplicaCount": auto.maxUnits,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(plan)}},
            "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
                "serverAddress": auto.prometheusAddress,
                "query": f"sum({series}{selector})",
                "threshold": f"{value:g}"}}
                for series, value in targets(plan, capacity)],
        },
    }


def autoscaling_objects(cr: dict[str, Any], plan: ServingPlan, capacity: CapacityPlan, *,
                        with_rules: bool, with_keda: bool) -> list[dict[str, Any]]:
    """The recording rules (when the PrometheusRule CRD exists) and, with spec.autoscaling,
    its autoscaler: KEDA's when its CRD exists, else an HPA."""
    objects = [prometheus_rule(cr, capacity)] if with_rules else []
    if plan.spec.autoscaling is not None:
        build = scaled_object if with_keda else horizontal_pod_autoscaler
        objects.append(build(cr, plan, capacity))
    return objects
