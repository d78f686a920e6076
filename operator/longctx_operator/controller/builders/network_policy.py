"""The engine pods' NetworkPolicy (spec.networkPolicy, off by default), pure.

One policy selects every engine pod of the CR (both roles, every revision, and the pods a
scale-down is draining: they still hold requests and still pull KV) and admits:

- from the CR's own serving pods, any port: the NIXL side channel, NIXL's UCX transfer
  (TCP; its data ports are chosen at run time, so they cannot be listed), data-parallel
  RPC between the pods of one group, and the decode routing sidecar's prefill leg;
- from the CR's endpoint picker, the serving ports (the InferencePool's target ports: the
  picker reads each endpoint's metrics there);
- from the CR's endpoint, the serving ports (it sends to a prefill engine directly while
  no decode pod is Ready);
- from spec.networkPolicy.clients, the serving ports (a Gateway's pods);
- from spec.networkPolicy.scrapers, the vLLM metrics ports (the PodMonitor's);
- from the longctx operator's pods (any namespace), the vLLM metrics ports: it reads
  whether draining pods still hold requests (engine_load.py).

RDMA traffic bypasses the kernel's network stack, which NetworkPolicy filters; only the
TCP side channel of an RDMA deployment is subject to it. Traffic from the node (kubelet
probes) is admitted by most CNIs regardless.
"""

from __future__ import annotations

from typing import Any

from longctx_core import contract
from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller.builders.endpoint import deployed as endpoint_deployed


def _ports(ports: list[int]) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in sorted(set(ports))]


# The operator's pods, as the Helm chart labels them.
OPERATOR_LABELS = {contract.NAME_LABEL: "longctx", contract.COMPONENT_LABEL: "operator"}


def engine_pods(cr_name: str) -> dict[str, Any]:
    """The CR's engine pods, serving or draining (rollout.draining_marks)."""
    return {"matchLabels": {contract.INSTANCE_LABEL: cr_name},
            "matchExpressions": [{"key": contract.SERVING_LABEL, "operator": "In",
                                  "values": ["true", "draining"]}]}


def network_policy(cr: dict[str, Any], plan: ServingPlan) -> dict[str, Any]:
    meta = cr["metadata"]
    name = meta["name"]
    spec = plan.spec.networkPolicy
    serving = _ports(list(plan.pool_target_ports))
    metrics = _ports([p for role in plan.roles for p in role.ports.http])
    engines = {"podSelector": engine_pods(name)}
    picker = {"podSelector": {"matchLabels": contract.selector_labels(
        name, contract.ROUTER_COMPONENT)}}
    ingress: list[dict[str, Any]] = [{"from": [engines]}]
    if plan.spec.router.enabled:
        ingress.append({"from": [picker], "ports": serving})
    if endpoint_deployed(plan.spec):
        ingress.append({"from": [{"podSelector": {"matchLabels": contract.selector_labels(
            name, contract.ENDPOINT_COMPONENT)}}], "ports": serving})
    if spec.clients:
        ingress.append({"from": [dict(p) for p in spec.clients], "ports": serving})
    if spec.scrapers:
        ingress.append({"from": [dict(p) for p in spec.scrapers], "ports": metrics})
    ingress.append({"from": [{"namespaceSelector": {},
                              "podSelector": {"matchLabels": OPERATOR_LABELS}}],
                    "ports": metrics})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": contract.network_policy(name), "namespace": meta["namespace"],
                     "labels": contract.labels(name, contract.ENGINE_CONFIG_COMPONENT),
                     "ownerReferences": [contract.owner_reference(cr)]},
        "spec": {"podSelector": engine_pods(name),
                 "policyTypes": ["Ingress"], "ingress": ingress},
    }
