"""Where and how many: spec.placement, spec.scaling, spec.autoscaling, spec.rollout,
spec.monitoring, spec.networkPolicy and the capacity planner's inputs (spec.capacity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx_core.api.schema import APIObject, Preserved, Quantity, Rule, api_field


@dataclass(frozen=True, kw_only=True)
class Placement(APIObject):
    """Where engine pods run."""

    gpuProduct: str = api_field("Required value of the node label nvidia.com/gpu.product.",
                                "NVIDIA-H200", max_length=63)  # a label value
    nodeSelector: dict[str, str] = api_field("Extra node labels to require.", {})
    tolerations: list[Preserved] = api_field("Tolerations (core/v1 Toleration).", [])
    priorityClassName: Optional[str] = api_field("Pod priority class.", None, max_length=253)
    topologyKey: Optional[str] = api_field(
        "A node label naming a domain (a rack, an NVLink domain). Each decode pod is placed "
        "in the domain of its unit's prefill pod (the same pod index when prefillPerUnit "
        "equals decodePerUnit, else any prefill pod of this deployment), because a "
        "max-context request moves tens of GiB of KV from prefill to decode. The "
        "TopologySatisfiable condition says when no domain of the cluster's nodes can hold "
        "a unit.", None, max_length=317)


@dataclass(frozen=True, kw_only=True)
class Scaling(APIObject):
    """The P/D unit spec.replicas counts: the ratio of prefill to decode pods it keeps."""

    CEL = (Rule("self.prefillPerUnit >= 1 && self.decodePerUnit >= 1",
                "prefillPerUnit is {self.prefillPerUnit} and decodePerUnit is "
                "{self.decodePerUnit}; both must be at least 1: a unit needs a prefill and a "
                "decode pod to serve a request"),)
    prefillPerUnit: int = api_field("Prefill pods per unit.", 1, maximum=64)
    decodePerUnit: int = api_field("Decode pods per unit.", 1, maximum=64)


@dataclass(frozen=True, kw_only=True)
class AutoscalingMetrics(APIObject):
    """The signals the autoscaler keeps at their targets; the units follow the one that
    needs the most."""

    CEL = (Rule("self.decodeCapacityPercent > 0 || has(self.waitingRequestsPerUnit)",
                "decodeCapacityPercent is 0 and waitingRequestsPerUnit is unset: the "
                "autoscaler has no signal; set decodeCapacityPercent above 0 or "
                "waitingRequestsPerUnit"),)
    decodeCapacityPercent: int = api_field(
        "Share of the decode role's max-context request slots (the HiSparse host pool and "
        "the GPU hot buffer, from the capacity plan) that demand may fill before a unit is "
        "added. 0 turns this signal off.", 80, minimum=0, maximum=100)
    waitingRequestsPerUnit: Optional[int] = api_field(
        "Requests waiting in the engines' queues (prefill and decode) per unit before a "
        "unit is added (vLLM's vllm:num_requests_waiting).", None, minimum=1)


@dataclass(frozen=True, kw_only=True)
class Autoscaling(APIObject):
    """An autoscaler on the CR's /scale: a KEDA ScaledObject when KEDA's CRD is installed,
    else an autoscaling/v2 HorizontalPodAutoscaler on External metrics."""

    CEL = (Rule("self.minUnits <= self.maxUnits",
                "minUnits ({self.minUnits}) is more than maxUnits ({self.maxUnits}); raise "
                "maxUnits or lower minUnits"),)
    minUnits: int = api_field("Fewest units.", 1, minimum=1, maximum=64)
    maxUnits: int = api_field("Most units.", minimum=1, maximum=64)
    metrics: AutoscalingMetrics = api_field("What the units follow.", AutoscalingMetrics())
    scaleDownStabilizationSeconds: int = api_field(
        "How long the autoscaler waits on lower demand before it removes a unit (a removed "
        "unit drains its in-flight long requests first).", 300, minimum=0, maximum=3600)
    prometheusAddress: str = api_field(
        "Prometheus that KEDA queries for the signals (recorded by the deployment's "
        "PrometheusRule).", "http://prometheus-operated.monitoring.svc:9090", max_length=512)


@dataclass(frozen=True, kw_only=True)
class Rollout(APIObject):
    """How a new revision (a change of the NIXL pairing key: model, image, vLLM version, KV
    dtype, speculative method, pinned attention backend or block size) replaces the
    serving one. Other changes roll in place, one pod at a time, only on the role they
    touch."""

    strategy: str = api_field(
        "Surge: the new revision comes up beside the old one, the router switches to it at "
        "once when it is Ready, and the old one drains (needs the GPUs of a second "
        "revision). Recreate: the old revision stops, then the new one starts (no extra "
        "GPUs; no serving during the model load).", "Surge", enum=("Surge", "Recreate"))
    minReadyReplicas: Optional[int] = api_field(
        "Ready pods of each role the new revision needs before the router switches to it "
        "(default: all of each role's replicas).", None, minimum=1)
    drainSeconds: Optional[int] = api_field(
        "How long the old revision keeps its pods after the switch so that in-flight "
        "requests finish (default: the predicted time of the longest request at "
        "maxContextTokens).", None, minimum=0, maximum=86400)


@dataclass(frozen=True, kw_only=True)
class Monitoring(APIObject):
    """Prometheus scraping."""

    podMonitor: bool = api_field("Create PodMonitors when the monitoring.coreos.com CRD exists.",
                                 True)


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy(APIObject):
    """A NetworkPolicy for the engine pods: their serving ports open only to the endpoint
    picker and `clients`, the metrics ports to `scrapers`, and everything else (the NIXL
    side channel and transfer, data-parallel RPC, the decode sidecar's prefill leg) only
    between the prefill and decode pods of this CR."""

    enabled: bool = api_field("Create the NetworkPolicy (the cluster's CNI must enforce it).",
                              False)
    clients: list[Preserved] = api_field(
        "NetworkPolicyPeers (networking.k8s.io/v1) that may reach the serving ports: the "
        "Gateway's pods, or the clients when there is no Gateway.", [], max_items=16)
    scrapers: list[Preserved] = api_field(
        "NetworkPolicyPeers that may scrape the vLLM metrics ports (the PodMonitor's "
        "Prometheus).", [], max_items=16)


@dataclass(frozen=True, kw_only=True)
class Capacity(APIObject):
    """Inputs of the capacity planner."""

    kvBudgetPerGpu: Optional[Quantity] = api_field(
        "KV memory left per GPU after weights and activations; overrides the planner's "
        "estimate.", None)
    gpuMemory: Quantity = api_field(
        "Memory of one GPU as CUDA reports it (torch.cuda.mem_get_info total). The default "
        "is an H200's: 150109880320 bytes (139.8 GiB, measured). Used only to estimate the "
        "KV budget.", Quantity("150109880320"))
    gpuMemoryUtilizationPercent: int = api_field(
        "Share of gpuMemory vLLM may use, in percent (--gpu-memory-utilization x 100; vLLM's "
        "default 0.9). Set it to match any --gpu-memory-utilization in engine.extraArgs.", 90,
        minimum=1, maximum=100)
    activationReservePerGpu: Quantity = api_field(
        "Memory per GPU the planner sets aside for activations, CUDA graphs and communication "
        "buffers, on top of the sparse-MLA prefill workspace it derives from maxContextTokens.",
        Quantity("4Gi"))
