"""Which nodes the engine pods' placement selects: the GPU product label and
spec.placement.nodeSelector. One matcher for the planner's host-memory check, the topology
check, `longctx plan --suggest` and the operator's message about GPUs a rollout still lacks."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence, TypeVar

from longctx_core.api.operation_types import Placement

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


class Labelled(Protocol):
    @property
    def labels(self) -> Mapping[str, str]: ...


NodeT = TypeVar("NodeT", bound=Labelled)


def required_labels(placement: Placement) -> dict[str, str]:
    """The node labels an engine pod requires, with their values."""
    return {GPU_PRODUCT_LABEL: placement.gpuProduct, **placement.nodeSelector}


def selects(placement: Placement, labels: Mapping[str, str]) -> bool:
    """Whether a node with these labels is one the engine pods may be scheduled on."""
    return all(labels.get(k) == v for k, v in required_labels(placement).items())


def selected(placement: Placement, nodes: Sequence[NodeT]) -> list[NodeT]:
    return [n for n in nodes if selects(placement, n.labels)]


def describe(placement: Placement) -> str:
    """The required labels as `key=value, ...`, for messages."""
    return ", ".join(f"{k}={v}" for k, v in required_labels(placement).items())
