"""The per-role plan: everything one role's objects and engines are built from, computed
once from a spec and passed down (to the operator's builders, the entrypoint, the checks).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import contract
from .api import LongContextDeploymentSpec
from .compat import pairing_key
from .identity import PodIdentity
from .layout import EnginePorts, Layout, engine_ports, role_layout
from .memory import PodMemory, hisparse_enabled, pod_memory
from .recipes import EngineCommand, build_command
from .rules import RecipeError, validate


@dataclass(frozen=True)
class RolePlan:
    spec: LongContextDeploymentSpec
    role: str
    layout: Layout
    ports: EnginePorts
    memory: PodMemory
    pairing_key: str

    @property
    def hisparse(self) -> bool:
        return hisparse_enabled(self.spec, self.role)

    @property
    def replicas(self) -> int:
        return self.layout.replicas

    @property
    def revision(self) -> str:
        return self.pairing_key

    def command(self, pod: PodIdentity) -> EngineCommand:
        """The `vllm serve` argv and env of one pod of this role."""
        return build_command(self, pod)


@dataclass(frozen=True)
class ServingPlan:
    """Both roles of one spec."""

    spec: LongContextDeploymentSpec
    prefill: RolePlan
    decode: RolePlan

    @property
    def roles(self) -> tuple[RolePlan, RolePlan]:
        return self.prefill, self.decode

    def role(self, name: str) -> RolePlan:
        if name not in contract.ROLES:
            raise RecipeError(f"role must be one of {', '.join(contract.ROLES)}, got {name!r}")
        return self.prefill if name == "prefill" else self.decode

    @property
    def revision(self) -> str:
        return self.prefill.pairing_key

    @property
    def pool_target_ports(self) -> tuple[int, ...]:
        """InferencePool target ports: the union of both roles' serving ports."""
        return tuple(sorted(set(self.prefill.ports.serving) | set(self.decode.ports.serving)))


def role_plan(spec: LongContextDeploymentSpec, role: str) -> RolePlan:
    layout = role_layout(spec, role)
    return RolePlan(spec=spec, role=role, layout=layout,
                    ports=engine_ports(layout, spec.kvTransfer.sideChannelPort),
                    memory=pod_memory(spec, layout), pairing_key=pairing_key(spec))


def serving_plan(spec: LongContextDeploymentSpec, cr_name: str | None = None) -> ServingPlan:
    """The plan of a valid spec; raises rules.RecipeError naming every problem."""
    validate(spec, cr_name)
    return ServingPlan(spec, *(role_plan(spec, role) for role in contract.ROLES))
