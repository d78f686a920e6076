"""`longctx plan --suggest`: the smallest layout of each role that the planner proves holds
the spec's maxContextTokens on nodes of a given GPU count and host memory.

Candidates are the layouts the API's rules admit on one node (gpusPerPod a power of two up
to the node's GPUs; prefill PCP with DCP 1 or equal to it; decode TP with DCP 1, or equal to
TP without HiSparse), every GPU of a pod serving. Each candidate is judged by planner.plan
and rules.problems, nothing here re-derives capacity. The smallest is the one with the
fewest GPUs per pod; among those, the one that holds the most max-context requests, then
the spec's own layout, then the widest split of one request (the lowest latency).
Everything else of the spec (model, pools, replicas, HiSparse on or off) is kept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.placement import required_labels
from longctx_core.sizing.host_memory import NodeMemory
from longctx_core.sizing.planner import CapacityPlan, plan
from longctx_core.plan.rules import problems


@dataclass(frozen=True)
class Suggestion:
    spec: LongContextDeploymentSpec          # the input spec with the suggested layouts
    changes: dict[str, dict[str, Any]]       # spec.prefill / spec.decode fields to set
    plan: CapacityPlan


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


def _layouts(role: str, gpus_per_node: int, hisparse: bool) -> Iterator[dict[str, Any]]:
    for gpus in _powers_of_two(gpus_per_node):
        for split in _powers_of_two(gpus):
            if role == "prefill":   # PCP ranks; TP must be 1 with context parallelism
                for dcp in sorted({1, split}):
                    yield {"gpusPerPod": gpus, "tensorParallel": 1, "dataParallel": gpus // split,
                           "contextParallel": {"prefill": split, "decode": dcp}}
            else:                   # TP ranks; DCP is 1 or the NIXL transfer size (TP)
                for dcp in [1] if hisparse else sorted({1, split}):
                    yield {"gpusPerPod": gpus, "tensorParallel": split,
                           "dataParallel": gpus // split,
                           "contextParallel": {"prefill": 1, "decode": dcp}}


def _with(spec: LongContextDeploymentSpec, role: str, fields: dict[str, Any]
          ) -> LongContextDeploymentSpec:
    current = getattr(spec, role)
    cp = dataclasses.replace(current.contextParallel, **fields["contextParallel"])
    rest = {k: v for k, v in fields.items() if k != "contextParallel"}
    return dataclasses.replace(spec, **{role: dataclasses.replace(current, contextParallel=cp,
                                                                   **rest)})


def _fields_of(spec: LongContextDeploymentSpec, role: str) -> dict[str, Any]:
    r = getattr(spec, role)
    return {"gpusPerPod": r.gpusPerPod, "tensorParallel": r.tensorParallel,
            "dataParallel": r.dataParallel,
            "contextParallel": {"prefill": r.contextParallel.prefill,
                                "decode": r.contextParallel.decode}}


def _role_fits(capacity: CapacityPlan, role: str) -> bool:
    if not getattr(capacity, role).fits:
        return False
    host = capacity.host_memory
    return not host.get("checked") or host[f"{role}PodGiB"] <= host["largestAllocatableGiB"]


def nodes_of(spec: LongContextDeploymentSpec, memory: Optional[int]) -> Optional[list[NodeMemory]]:
    """One node the placement selects with `memory` bytes allocatable (None: not checked)."""
    if memory is None:
        return None
    return [NodeMemory("suggested-node", required_labels(spec.placement), memory)]


def suggest(spec: LongContextDeploymentSpec, gpus_per_node: int,
            node_memory: Optional[int] = None) -> Suggestion:
    """The smallest layout of each role that fits; raises ValueError saying why none does."""
    nodes = nodes_of(spec, node_memory)
    chosen: dict[str, dict[str, Any]] = {}
    for role in ("prefill", "decode"):
        fitting = []
        last: Optional[CapacityPlan] = None
        for fields in _layouts(role, gpus_per_node, spec.decode.hiSparse.enabled):
            candidate = _with(spec, role, fields)
            if problems(candidate):
                continue
            last = plan(candidate, nodes)
            if _role_fits(last, role):
                capacity = getattr(last, role)
                own = _with(spec, role, fields) == _with(spec, role, _fields_of(spec, role))
                fitting.append(((fields["gpusPerPod"], -capacity.max_concurrent, not own,
                                 -fields["dataParallel"]), fields))
        if not fitting:
            reason = (last.refusal or "") if last is not None else "no layout passes the rules"
            raise ValueError(f"no spec.{role} layout of up to {gpus_per_node} GPUs per node "
                             f"holds {spec.maxContextTokens} tokens; the largest: {reason}")
        chosen[role] = min(fitting, key=lambda c: c[0])[1]
    out = spec
    for role, fields in chosen.items():
        out = _with(out, role, fields)
    return Suggestion(out, chosen, plan(out, nodes))
