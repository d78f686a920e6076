"""The router in front of a deployment's engines, resolved once from `spec.router`.

Each router type is one implementation of `Router`: the objects it adds, what it needs on
the engine pods, the revision it sends requests to, whether it has switched to a revision,
how it reports readiness, where clients reach it and where `longctx bench` sends requests.
No other module asks which router a spec uses; they call `router_for(spec)`.
"""

from __future__ import annotations

from typing import Any, Optional

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.api.schema import SpecError
from longctx_core.plan.roles import RolePlan, ServingPlan

from longctx_operator.controller.builders import picker, vllm_router
from longctx_operator.controller.builders.router import (llmd_objects, pod_annotations,
                                                         routing_sidecar)
from longctx_operator.controller.cluster import Cluster
from longctx_operator import kinds

Status = tuple[bool, str, str]   # RouterReady: (ready, reason, message)


class Router:
    """No router (spec.router.enabled false): clients reach decode's headless Service."""

    # Whether it decides per request to skip the prefill pool (llm-d's P/D decider).
    decides_disaggregation = False

    def objects(self, cr: dict[str, Any], plan: ServingPlan, serving: str) -> list[dict[str, Any]]:
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

    def serving_revision(self, kube: Cluster, cr: dict[str, Any]) -> Optional[str]:
        """The revision it sends requests to, as the cluster shows it (None: none yet)."""
        return None

    def selects_only(self, kube: Cluster, cr: dict[str, Any], revision: str) -> bool:
        """Whether every one of its pods sends requests to `revision` only."""
        return True

    def leave_out(self, kube: Cluster, cr: dict[str, Any], desired: list[dict[str, Any]],
                  pods: list[str]) -> bool:
        """Makes its `desired` objects send nothing new to `pods`, whose serving label a
        scale-down turns off; whether its running pods already do."""
        return True

    def move_off(self, kube: Cluster, cr: dict[str, Any], desired: list[dict[str, Any]],
                 cordoned: set[str]) -> list[str]:
        """Makes its `desired` objects move its pods off the `cordoned` nodes (a drain);
        the nodes it starts to move off (not those a move already under way leaves)."""
        return []

    def status(self, kube: Cluster, cr: dict[str, Any]) -> Optional[Status]:
        name = self.deployment(cr["metadata"]["name"])
        if name is None:
            return None
        return picker.picker_status(kube.get("apps/v1", "Deployment",
                                             cr["metadata"]["namespace"], name))

    def endpoint(self, cr_name: str, namespace: str) -> str:
        """Where clients send requests, in words (status.endpoint)."""
        return f"{contract.headless_service(cr_name, 'decode')}.{namespace}.svc"

    def bench_url(self, cr_name: str, namespace: str) -> str:
        """The URL `longctx bench` sends requests to from inside the cluster."""
        raise ValueError("spec.router.enabled is false: requests go to the decode pods "
                         "directly; pass their address with --url")


class LlmD(Router):
    """llm-d: an InferencePool, the endpoint picker and the decode routing sidecar
    (builders/router.py, builders/picker.py). The pool's selector is the serving revision."""

    decides_disaggregation = True

    def __init__(self, router: api.Router):
        if router.sessionAffinity != "prefix":
            raise SpecError(f"spec.router.sessionAffinity={router.sessionAffinity!r} is "
                            "vllm-router's: llm-d's picker keeps sessions by prefix and "
                            "spreads new ones itself (no-hit-lru-scorer). Set "
                            "spec.router.sessionAffinity to prefix, or spec.router.type to "
                            "vllm-router")
        self.spec = router

    def objects(self, cr: dict[str, Any], plan: ServingPlan, serving: str) -> list[dict[str, Any]]:
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

    # The picker drops a pod as soon as its serving label turns off: leave_out is True.

    def _pool_revision(self, kube: Cluster, cr: dict[str, Any]) -> Optional[str]:
        meta = cr["metadata"]
        pool = kube.get(kinds.KIND_BY_NAME["InferencePool"].api_version, "InferencePool",
                        meta["namespace"], contract.inference_pool(meta["name"]))
        return (((pool or {}).get("spec") or {}).get("selector") or {}).get(
            "matchLabels", {}).get(contract.PAIRING_LABEL)

    def serving_revision(self, kube: Cluster, cr: dict[str, Any]) -> Optional[str]:
        return self._pool_revision(kube, cr)

    def selects_only(self, kube: Cluster, cr: dict[str, Any], revision: str) -> bool:
        # The picker follows the pool's selector at once.
        return self._pool_revision(kube, cr) == revision

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
    revision's pods by label; its pod template names that revision."""

    def objects(self, cr: dict[str, Any], plan: ServingPlan, serving: str) -> list[dict[str, Any]]:
        return vllm_router.vllm_router_objects(cr, plan, serving)

    def pod_monitor(self, cr: dict[str, Any]) -> Optional[dict[str, Any]]:
        return vllm_router.vllm_router_pod_monitor(cr)

    def deployment(self, cr_name: str) -> Optional[str]:
        return contract.vllm_router(cr_name)

    def _live(self, kube: Cluster, cr: dict[str, Any]) -> Optional[dict[str, Any]]:
        meta = cr["metadata"]
        return kube.get("apps/v1", "Deployment", meta["namespace"],
                        contract.vllm_router(meta["name"]))

    def serving_revision(self, kube: Cluster, cr: dict[str, Any]) -> Optional[str]:
        return vllm_router.serving_revision(self._live(kube, cr))

    def selects_only(self, kube: Cluster, cr: dict[str, Any], revision: str) -> bool:
        desired = {"spec": {"template": {"metadata": {"labels": {
            contract.PAIRING_LABEL: revision}}}}}
        if not vllm_router.rolled_out(desired, self._live(kube, cr)):
            return False
        # An old router pod still shutting down serves whoever still holds its address: the
        # revision it discovers must outlive it.
        return all((p["metadata"].get("labels") or {}).get(contract.PAIRING_LABEL) == revision
                   for p in self._pods(kube, cr))

    def _pods(self, kube: Cluster, cr: dict[str, Any]) -> list[dict[str, Any]]:
        meta = cr["metadata"]
        return kube.list("v1", "Pod", meta["namespace"],
                         contract.selector_labels(meta["name"], contract.ROUTER_COMPONENT))

    def leave_out(self, kube: Cluster, cr: dict[str, Any], desired: list[dict[str, Any]],
                  pods: list[str]) -> bool:
        # Its discovery may keep a pod whose labels stop matching: the router rolls to a
        # pod that never discovers them (builders/vllm_router.py).
        name = contract.vllm_router(cr["metadata"]["name"])
        deployment = next(o for o in desired if o["kind"] == "Deployment"
                          and o["metadata"]["name"] == name)
        vllm_router.roll_for_draining(deployment, pods)
        if not vllm_router.rolled_out(deployment, kube.get(
                "apps/v1", "Deployment", cr["metadata"]["namespace"], name)):
            return False
        # A router pod still shutting down serves whoever holds its address.
        return all(set(pods) <= vllm_router.draining_pods(p) for p in self._pods(kube, cr))

    def move_off(self, kube: Cluster, cr: dict[str, Any], desired: list[dict[str, Any]],
                 cordoned: set[str]) -> list[str]:
        if not cordoned:
            return []
        meta = cr["metadata"]
        nodes = sorted({p["spec"].get("nodeName") for p in self._pods(kube, cr)
                        if (p.get("spec") or {}).get("nodeName") in cordoned
                        and not p["metadata"].get("deletionTimestamp")})
        if not nodes:
            return []
        name = contract.vllm_router(meta["name"])
        deployment = next(o for o in desired if o["kind"] == "Deployment"
                          and o["metadata"]["name"] == name)
        vllm_router.roll_off_nodes(deployment, nodes)
        live = self._live(kube, cr) or {}
        asked = (((live.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
            "annotations", {}).get(vllm_router.LEAVING_NODES_ANNOTATION)
        return [] if asked == ",".join(nodes) else nodes

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
