"""The per-role plan: everything one role's objects and engines are built from, computed
once from a spec and passed down (to the operator's builders, the entrypoint, the checks).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any, Optional

from longctx_core import contract
from longctx_core.api.spec import LongContextDeploymentSpec, dump_spec, load_spec
from longctx_core.plan.revision import pairing_key
from longctx_core.plan.faults import FaultSettings, fault_settings
from longctx_core.sizing.layout import EnginePorts, Layout, engine_ports, role_layout
from longctx_core.sizing.performance import summary_at_max_context
from longctx_core.sizing.planner import CapacityPlan, RoleCapacity, plan as capacity_plan
from longctx_core.sizing.memory import PodMemory, hisparse_enabled, pod_memory
from longctx_core.plan.rules import RecipeError, validate
from longctx_core.launch import LaunchDocument


@dataclass(frozen=True)
class RolePlan:
    spec: LongContextDeploymentSpec
    role: str
    layout: Layout
    ports: EnginePorts
    memory: PodMemory
    # The role's figures in the capacity plan: the one carrier of the HiSparse pool's bytes
    # (capacity.hisparse), which host_pool_gib and the capacity rules both read.
    capacity: RoleCapacity
    pairing_key: str
    faults: FaultSettings       # the data path's timeouts and failure policy (faults.py)
    # The role revision the role's objects belong to: the pairing key, or a replacement of
    # this role's pods that the operator brings up beside the serving ones
    # (controller/replacement.py).
    revision: str = ""
    # What the role's pods run, once the operator has rendered it for its CR
    # (controller/rendering.py); builders read it instead of rendering again.
    document: Optional[LaunchDocument] = None

    def __post_init__(self) -> None:
        if not self.revision:
            object.__setattr__(self, "revision", self.pairing_key)

    @property
    def hisparse(self) -> bool:
        return hisparse_enabled(self.spec, self.role)

    @property
    def replicas(self) -> int:
        return self.layout.replicas


@dataclass(frozen=True)
class ServingPlan:
    """Both roles of one spec."""

    spec: LongContextDeploymentSpec
    prefill: RolePlan
    decode: RolePlan
    capacity: CapacityPlan      # the capacity plan (sizing/planner.py) the builders read
    # The performance model at maxContextTokens (None for an explicit architecture).
    prediction: Optional[dict[str, Any]] = None

    @property
    def roles(self) -> tuple[RolePlan, RolePlan]:
        return self.prefill, self.decode

    def role(self, name: str) -> RolePlan:
        if name not in contract.ROLES:
            raise RecipeError(f"role must be one of {', '.join(contract.ROLES)}, got {name!r}")
        return self.prefill if name == "prefill" else self.decode

    @property
    def revision(self) -> str:
        """The revision: the pairing key both roles share (each role's objects are named
        for its own role revision of it)."""
        return self.prefill.pairing_key

    @property
    def pairing_key(self) -> str:
        return self.prefill.pairing_key

    @property
    def role_revisions(self) -> dict[str, str]:
        return {r.role: r.revision for r in self.roles}

    def with_role_revisions(self, revisions: dict[str, str]) -> "ServingPlan":
        """The same plan, each role's objects named for its role revision in `revisions`
        (a role it does not name keeps its own)."""
        return dataclasses.replace(self, **{
            r.role: dataclasses.replace(r, revision=revisions.get(r.role, r.revision))
            for r in self.roles})

    @property
    def pool_target_ports(self) -> tuple[int, ...]:
        """InferencePool target ports: the union of both roles' serving ports."""
        return tuple(sorted(set(self.prefill.ports.serving) | set(self.decode.ports.serving)))


def role_plan(spec: LongContextDeploymentSpec, role: str, faults: FaultSettings | None = None,
              capacity: CapacityPlan | None = None) -> RolePlan:
    """One role's plan; `capacity`: the spec's capacity plan, when already made."""
    layout = role_layout(spec, role)
    capacity = capacity or capacity_plan(spec)
    figures = capacity.prefill if role == "prefill" else capacity.decode
    return RolePlan(spec=spec, role=role, layout=layout,
                    ports=engine_ports(layout, spec.kvTransfer.sideChannelPort,
                                       spec.router.decode_sidecar),
                    memory=pod_memory(spec, layout, figures.hisparse_pool_bytes),
                    capacity=figures, pairing_key=pairing_key(spec),
                    faults=faults or fault_settings(spec))


def serving_plan(spec: LongContextDeploymentSpec, cr_name: str | None = None,
                 capacity: CapacityPlan | None = None) -> ServingPlan:
    """The plan of a valid spec; raises rules.RecipeError naming every problem. `capacity`:
    the capacity plan already made for the spec (the operator's, with the nodes' memory)."""
    validate(spec, cr_name)
    capacity = capacity or capacity_plan(spec)
    faults, prediction = _priced(json.dumps(dump_spec(spec), sort_keys=True),
                                 capacity.decode.max_concurrent)
    return ServingPlan(spec, *(role_plan(spec, role, faults, capacity)
                               for role in contract.ROLES),
                       capacity=capacity, prediction=prediction)


@functools.lru_cache(maxsize=256)
def _priced(spec_json: str, held: int) -> tuple[FaultSettings, Optional[dict[str, Any]]]:
    """What the performance model says of a spec whose decode role holds `held` max-context
    requests, once per distinct spec (it is pure, and the dearest part of a plan: every
    reconcile of an unchanged CR reuses it)."""
    spec = load_spec(json.loads(spec_json))
    return fault_settings(spec), summary_at_max_context(spec, held=held)
