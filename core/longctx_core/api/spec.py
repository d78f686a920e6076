"""The LongContextDeployment API (longctx.dev/v1alpha1): the single source of truth.

This module is the CR's root (the spec, its cross-section rules, load_spec); each section's
types live in an api_<section> module. `crds/` and the chart's CRD are generated from these
classes (`longctx crd`), and the operator, planner and engine recipes read specs
through `load_spec`, so defaults and field names cannot drift between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from longctx_core.api.engine_types import Engine
from longctx_core.api.model_types import PRESET_MTP_MAP, Model
from longctx_core.api.operation_types import (Autoscaling, Capacity, Monitoring, NetworkPolicy, Placement,
                             Rollout, Scaling)
from longctx_core.api.role_types import DIVIDES, RANK_GPUS, RANKS_PER_POD, Decode, Prefill
from longctx_core.api.serving_types import Endpoint, KVTransfer, Router
from longctx_core.contract import MAX_CR_NAME_LENGTH, MAX_POOL_TARGET_PORTS
from longctx_core.api.schema import APIObject, Rule, api_field, dump, load

SINGULAR = "longcontextdeployment"
SHORT_NAMES = ("lcd",)

MAX_NAME_LENGTH = MAX_CR_NAME_LENGTH

NAME_RULE = Rule(f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                 f"metadata.name {{self.metadata.name}} is longer than {MAX_NAME_LENGTH} "
                 "characters; the StatefulSet names derived from it (<name>-prefill-<revision> "
                 "plus the controller's hash) must stay within Kubernetes' 63-character "
                 "limit: choose a shorter name")


@dataclass(frozen=True, kw_only=True)
class LongContextDeploymentSpec(APIObject):
    """A prefill/decode-disaggregated, long-context vLLM deployment on H200 nodes."""

    CEL = (
        Rule("self.engine.kvCacheDtype != 'auto' || "
             "(self.prefill.contextParallel.decode == 1 && self.decode.contextParallel.decode == 1)",
             "engine.kvCacheDtype is auto, a bf16 cache on H200, but decode context "
             "parallelism (prefill {self.prefill.contextParallel.decode}, decode "
             "{self.decode.contextParallel.decode}) needs fp8_ds_mla: set engine.kvCacheDtype "
             "to fp8"),
        Rule("self.engine.speculative.method != 'mtp' || "
             f"(has(self.model.preset) && {PRESET_MTP_MAP}[self.model.preset] > 0) || "
             "(has(self.model.architecture) && self.model.architecture.mtpLayers > 0)",
             "engine.speculative.method is mtp but the model has no MTP layers "
             "(architecture.mtpLayers 0); set engine.speculative.method to none"),
        Rule("self.prefill.contextParallel.prefill == 1 || "
             "self.engine.speculative.method != 'mtp' || self.engine.speculative.draftTokens == 1 "
             f"|| (has(self.model.preset) && {PRESET_MTP_MAP}[self.model.preset] <= 1) || "
             "(has(self.model.architecture) && self.model.architecture.mtpLayers <= 1)",
             "prefill context parallelism ({self.prefill.contextParallel.prefill}) runs only "
             "single-module MTP, but the model has several MTP layers and "
             "engine.speculative.draftTokens is {self.engine.speculative.draftTokens}; set "
             "engine.speculative.draftTokens to 1"),
        Rule("!has(self.rollout.minReadyReplicas) || has(self.replicas) || "
             "!has(self.prefill.replicas) || !has(self.decode.replicas) || "
             "(self.rollout.minReadyReplicas <= self.prefill.replicas && "
             "self.rollout.minReadyReplicas <= self.decode.replicas)",
             "rollout.minReadyReplicas ({self.rollout.minReadyReplicas}) is more than a role's "
             "replicas (prefill {self.prefill.replicas}, decode {self.decode.replicas}): the "
             "new revision could never be ready enough to switch to; lower it or leave it "
             "unset (all replicas)"),
        Rule("!self.router.enabled || (" + " && ".join(
            f"self.{role}.gpusPerPod <= {MAX_POOL_TARGET_PORTS} * "
            f"{RANK_GPUS.replace('self.', f'self.{role}.')}" for role in ("prefill", "decode"))
             + ")",
             f"the router reaches every engine rank of a pod on its own port, and an "
             f"InferencePool lists at most {MAX_POOL_TARGET_PORTS}: with prefill.gpusPerPod "
             "{self.prefill.gpusPerPod} and decode.gpusPerPod {self.decode.gpusPerPod}, lower "
             "gpusPerPod or raise tensorParallel so that a pod holds at most "
             f"{MAX_POOL_TARGET_PORTS} ranks"),
        *(Rule(f"(has(self.{role}.replicas) && !has(self.replicas)) || "
               f"!{DIVIDES.replace('self.', f'self.{role}.')} || "
               f"self.{role}.dataParallel < {RANKS_PER_POD.replace('self.', f'self.{role}.')} || "
               f"self.scaling.{role}PerUnit % (self.{role}.dataParallel / "
               f"{RANKS_PER_POD.replace('self.', f'self.{role}.')}) == 0",
               f"scaling.{role}PerUnit ({{self.scaling.{role}PerUnit}}) must be a multiple of "
               f"the pods of one {role} data-parallel group ({role}.dataParallel "
               f"{{self.{role}.dataParallel}} / the ranks one pod holds), so that every unit "
               "holds whole engines") for role in ("prefill", "decode")),
        Rule("!has(self.autoscaling) || (!has(self.prefill.replicas) && "
             "!has(self.decode.replicas))",
             "autoscaling is set beside explicit prefill.replicas or decode.replicas: the "
             "autoscaler scales spec.replicas in P/D units (scaling.prefillPerUnit and "
             "decodePerUnit pods each); remove prefill.replicas and decode.replicas"),
        Rule("!has(self.endpoint.routerURL) || self.router.type == 'llm-d'",
             "endpoint.routerURL ({self.endpoint.routerURL}) is set but router.type is "
             "vllm-router, whose pods the endpoint finds by label: remove endpoint.routerURL"),
        Rule("!has(self.autoscaling) || has(self.replicas)",
             "autoscaling is set but replicas is not: the autoscaler reads and writes "
             "spec.replicas (P/D units) through /scale and does nothing while it is unset; "
             "set replicas to the units to start with, e.g. {self.autoscaling.minUnits}"),
    )

    model: Model = api_field("The model.")
    maxContextTokens: int = api_field("Longest context (prompt + output) served: --max-model-len. "
                                      "The planner proves the layout holds it.", minimum=1,
                                      maximum=16777216)
    engine: Engine = api_field("Engine settings shared by both roles.", Engine())
    prefill: Prefill = api_field("The prefill role.", Prefill())
    decode: Decode = api_field("The decode role.", Decode())
    router: Router = api_field("The llm-d router.", Router())
    endpoint: Endpoint = api_field("The client-facing endpoint that continues broken answers.",
                                   Endpoint())
    kvTransfer: KVTransfer = api_field("NIXL KV transfer.", KVTransfer())
    placement: Placement = api_field("Placement of engine pods.", Placement())
    monitoring: Monitoring = api_field("Monitoring.", Monitoring())
    networkPolicy: NetworkPolicy = api_field("Network isolation of the engine pods.",
                                             NetworkPolicy())
    replicas: Optional[int] = api_field(
        "P/D units (the CR's /scale: `kubectl scale`, an HPA or KEDA write it). Each unit is "
        "scaling.prefillPerUnit prefill and scaling.decodePerUnit decode pods; while it is "
        "set, prefill.replicas and decode.replicas are ignored.", None, minimum=0, maximum=64)
    scaling: Scaling = api_field("The prefill:decode ratio of a unit.", Scaling())
    autoscaling: Optional[Autoscaling] = api_field(
        "Scale spec.replicas on the decode capacity signal and the waiting requests.", None)
    rollout: Rollout = api_field("How a new revision replaces the serving one.", Rollout())
    capacity: Capacity = api_field("Capacity planner inputs.", Capacity())


def load_spec(spec: dict[str, Any] | None) -> LongContextDeploymentSpec:
    """Typed spec from a manifest's `spec`, with the CRD's defaults; raises SpecError."""
    return load(LongContextDeploymentSpec, spec or {}, "spec")


def dump_spec(spec: LongContextDeploymentSpec) -> dict[str, Any]:
    return dump(spec)
