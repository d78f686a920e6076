"""Whether the cluster's nodes can hold a P/D unit inside one topology domain (pure).

With spec.placement.topologyKey the decode pods of a unit must land in the domain (the
node label's value: a rack, an NVLink domain) of their prefill pods. Every engine pod
takes a whole node (gpusPerPod GPUs), so a unit needs prefillPerUnit + decodePerUnit of
the nodes the placement selects, all carrying one value of the key. The nodes are an
input (the operator lists them), so this stays a function of its arguments.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing import placement
from longctx_core.sizing.host_memory import NodeMemory


@dataclass(frozen=True)
class TopologyPlan:
    key: str
    unit_nodes: int                 # nodes one unit needs
    domains: Optional[dict[str, int]]  # domain -> selected nodes; None: nodes unknown
    problem: Optional[str] = None

    @property
    def satisfiable(self) -> Optional[bool]:
        return None if self.domains is None else self.problem is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topologyKey": self.key, "unitNodes": self.unit_nodes}
        if self.domains is not None:
            out.update(domains=dict(self.domains), satisfiable=self.problem is None)
        if self.problem:
            out["problem"] = self.problem
        return out


def topology_plan(spec: LongContextDeploymentSpec,
                  nodes: Optional[list[NodeMemory]]) -> Optional[TopologyPlan]:
    """None without a topologyKey; the domains and, when no domain can hold a unit, why."""
    key = spec.placement.topologyKey
    if key is None:
        return None
    need = spec.scaling.prefillPerUnit + spec.scaling.decodePerUnit
    if nodes is None:
        return TopologyPlan(key, need, None)
    selected = placement.selected(spec.placement, nodes)
    domains = dict(sorted(Counter(n.labels[key] for n in selected if key in n.labels).items()))
    where = f"nodes with {placement.describe(spec.placement)}"
    problem = None
    if not domains:
        problem = (f"spec.placement.topologyKey is {key}, but none of the {len(selected)} "
                   f"{where} carries that label, so no decode pod can be placed beside its "
                   f"prefill pod; label the nodes with their domain (kubectl label node "
                   f"<node> {key}=<domain>) or unset spec.placement.topologyKey")
    elif max(domains.values()) < need:
        largest = max(domains, key=domains.__getitem__)
        problem = (f"spec.placement.topologyKey is {key}: a unit needs {need} nodes in one "
                   f"domain (scaling.prefillPerUnit {spec.scaling.prefillPerUnit} + "
                   f"decodePerUnit {spec.scaling.decodePerUnit} pods, one per node), but the "
                   f"largest domain, {key}={largest}, has {domains[largest]} of the {where}; "
                   "lower the pods per unit, add nodes to a domain, or choose a coarser key")
    return TopologyPlan(key, need, domains, problem)
