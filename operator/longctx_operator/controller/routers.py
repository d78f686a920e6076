"""The router in front of a deployment's engines, resolved once from `spec.router`.

Each router type is one implementation of `Router`: the objects it adds (with what the
drains ask of them, `RouterEdits`), what it needs on the engine pods, and, read from one
reconcile's snapshot, the revision it sends requests to, whether it has switched, the
drained nodes its pods must leave and its readiness; where clients reach it and where
`longctx bench` sends requests. No other module asks which router a spec uses; they call
`router_for(spec)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.api.schema import SpecError
from longctx_core.plan.roles import RolePlan, ServingPlan

from longctx_operator.controller.builders import picker, vllm_router
from longctx_operator.controller.builders.router import (llmd_objects, pod_annotations,
                                                         routing_sidecar)
from longctx_operator.controller.observe import Snapshot

Status = tuple[bool, str, str]   # RouterReady: (ready, reason, message)


@dataclass(frozen=True)
class RouterEdits:
    """What the drains ask of the router's objects, as inputs to its builder: the pods that
    left the pool (a scale-down, a role swap), which it must never discover again, and the
    drained nodes its pods run on, which they must leave."""

    draining_pods: tuple[str, ...] = ()
    leaving_nodes: tuple[str, ...] = ()


class Router:
    """No router (spec.router.enabled false): clients reach decode's headless Service."""

    # Whether it decides per request to skip the prefill pool (llm-d's P/D decider).
    decides_disaggregation = False

    def objects(self, cr: dict[str, Any], plan: ServingPlan, serving: str,
                edits: RouterEdits = RouterEdits()) -> list[dict[str, Any]]:
        """Its objects, sending requests to the `serving` revision."""
        return []

    def pod_monitor(self, cr: dict[str, Any]) -> Optional[dict[str, Any]]:
        return None

    def engine_pod(self, role: RolePlan, annotations: dict[str, str],
                   pod_spec: dict[str, Any]) -> None:
        """Adds what it needs to an engine pod's template (annotations, containers)."""

    def deployment(self, cr_name: str) -> Optional[str]:
        """The Deployment that runs it (its readiness is the RouterReady condition)."""
        return None

    def serving_revision(self, snapshot: Snapshot) -> Optional[str]:
        """The revision it sends requests to, as the cluster shows it (None: none yet)."""
        return None

    def selects_only(self, snapshot: Snapshot, revision: str) -> bool:
        """Whether every one of its pods sends requests to `revision` only."""
        return True

    def left_out(self, snapshot: Snapshot, revision: str, pods: list[str]) -> bool:
        """Whether its running pods send nothing new to `pods`, whose serving label a drain
        turned off, its objects discovering `revision`."""
        return True

    def nodes_to_leave(self, snapshot: Snapshot) -> list[str]:
        """The drained (cordoned) nodes its pods run on (not pods already going)."""
        return []

    def asked_to_leave(self, snapshot: Snapshot) -> list[str]:
        """The nodes its live objects already ask its pods to leave."""
        return []

    def status(self, snapshot: Snapshot) -> Optional[Status]:
        name = self.deployment(snapshot.cr["metadata"]["name"])
        if name is None:
            return None
        return picker.picker_status(snapshot.child("Deployment", name))

    def endpoint(self, cr_name: str, namespace: str) -> str:
        """Where clients send requests, in words (status.endpoint)."""
        return f"{contract.headless_service(cr_name, 'decode')}.{namespace}.svc"

    def bench_url(self, cr_name: str, namespace: str) -> str:
        """The URL `longctx bench` sends requests to from inside the cluster."""
        raise ValueError("spec.router.enabled is false: requests go to the decode pods "
                         "directly; pass their address with --url")


class LlmD(Router):
    """llm-d: an InferencePool, the endpoint picker and the decode routing sidecar
    (builders/router.py, builders/picker.py). The pool's selector is the serving revision;
    the picker drops a pod as soon as its serving label turns off, so it needs no edits."""

    decides_disaggregation = True

    def __init__(self, router: api.Router):
        if router.sessionAffinity != "prefix":
            raise SpecError(f"spec.router.sessionAffinity={router.sessionAffinity!r} is "
                            "vllm-router's: llm-d's picker keeps sessions by prefix and "
                            "spreads new ones itself (no-hit-lru-scorer). Set "
                            "spec.router.sessionAffinity to prefix, or spec.router.type to "
                            "vllm-router")
        self.spec = router

    def objects(self, cr: dict[str, Any], plan: ServingPlan, serving: str,
                edits: RouterEdits = RouterEdits()) -> list[dict[str, Any]]:
        return llmd_objects(cr, plan, serving)

    def pod_monitor(self, cr: dict[str, Any]) -> Optional[dict[str, Any]]:
        return picker.picker_pod_monitor(cr)

    def engine_pod(self, role: RolePlan, annotations: dict[str, str],
                   pod_spec: dict[str, Any]) -> None:
        # The picker offers only the ports this pod serves (one per rank).
        annotations.update(pod_annotations(role))
        if role.role == "decode":
            pod_spec["initContainers"] = [routing_sidecar(role)]

    def deployment(self, cr_name: str) -> Optional[str]:
        return contract.picker(cr_name)

    def serving_revision(self, snapshot: Snapshot) -> Optional[str]:
        pool = snapshot.child("InferencePool",
                              contract.inference_pool(snapshot.cr["metadata"]["name"]))
        return (((pool or {}).get("spec") or {}).get("selector") or {}).get(
            "matchLabels", {}).get(contract.PAIRING_LABEL)

    def selects_only(self, snapshot: Snapshot, revision: str) -> bool:
        # The picker follows the pool's selector at once.
        return self.serving_revision(snapshot) == revision

    def endpoint(self, cr_name: str, namespace: str) -> str:
        gateway = self.spec.gateway
        if gateway is not None:
            return (f"gateway {gateway.namespace or namespace}/{gateway.name} "
                    f"(HTTPRoute {namespace}/{cr_name})")
        return f"inferencepool {namespace}/{contract.inference_pool(cr_name)}"

    def bench_url(self, cr_name: str, namespace: str) -> str:
        raise ValueError("spec.router.type='llm-d': requests enter through your Gateway; pass "
                         "its address with --url (e.g. --url http://my-gateway.gateway-ns.svc:80)")


class VllmRouter(Router):
    """vLLM's own router (builders/vllm_router.py): a Deployment that discovers the serving
    revision's pods by label; its pod template names that revision. Its discovery may keep
    a pod whose labels stop matching, so a drain rolls it to a pod that never discovers the
    pods leaving the pool; a node drain rolls it off the node (its PDB refuses eviction)."""

    def objects(self, cr: dict[str, Any], plan: ServingPlan, serving: str,
                edits: RouterEdits = RouterEdits()) -> list[dict[str, Any]]:
        return vllm_router.vllm_router_objects(cr, plan, serving, edits.draining_pods,
                                               edits.leaving_nodes)

    def pod_monitor(self, cr: dict[str, Any]) -> Optional[dict[str, Any]]:
        return vllm_router.vllm_router_pod_monitor(cr)

    def deployment(self, cr_name: str) -> Optional[str]:
        return contract.vllm_router(cr_name)

    def _live(self, snapshot: Snapshot) -> Optional[dict[str, Any]]:
        return snapshot.child("Deployment", contract.vllm_router(snapshot.cr["metadata"]["name"]))

    def serving_revision(self, snapshot: Snapshot) -> Optional[str]:
        return vllm_router.serving_revision(self._live(snapshot))

    def selects_only(self, snapshot: Snapshot, revision: str) -> bool:
        # An old router pod still shutting down serves whoever still holds its address: the
        # revision it discovers must outlive it.
        return vllm_router.rolled_out(self._live(snapshot), revision) and all(
            (p["metadata"].get("labels") or {}).get(contract.PAIRING_LABEL) == revision
            for p in snapshot.component_pods(contract.ROUTER_COMPONENT))

    def left_out(self, snapshot: Snapshot, revision: str, pods: list[str]) -> bool:
        # A router pod still shutting down serves whoever holds its address.
        return vllm_router.rolled_out(self._live(snapshot), revision, pods) and all(
            set(pods) <= vllm_router.draining_pods(p)
            for p in snapshot.component_pods(contract.ROUTER_COMPONENT))

    def nodes_to_leave(self, snapshot: Snapshot) -> list[str]:
        cordoned = snapshot.cordoned
        return sorted({p["spec"].get("nodeName")
                       for p in snapshot.component_pods(contract.ROUTER_COMPONENT)
                       if (p.get("spec") or {}).get("nodeName") in cordoned
                       and not p["metadata"].get("deletionTimestamp")})

    def asked_to_leave(self, snapshot: Snapshot) -> list[str]:
        return vllm_router.leaving_nodes(self._live(snapshot))

    def endpoint(self, cr_name: str, namespace: str) -> str:
        return f"service {namespace}/{contract.vllm_router(cr_name)}:{contract.VLLM_ROUTER_PORT}"

    def bench_url(self, cr_name: str, namespace: str) -> str:
        return (f"http://{contract.vllm_router(cr_name)}.{namespace}.svc:"
                f"{contract.VLLM_ROUTER_PORT}")


# By spec.router.type (the API's enum).
_TYPES = {"llm-d": LlmD, "vllm-router": lambda router: VllmRouter()}


def router_for(spec: api.LongContextDeploymentSpec) -> Router:
    """The router of a spec (a Router that adds nothing when spec.router.enabled is false)."""
    if not spec.router.enabled:
        return Router()
    return _TYPES[spec.router.type](spec.router)
