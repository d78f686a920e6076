"""The one placement matcher: the planner, `longctx plan --suggest`, the topology check and
the operator's GPU-shortage message all select nodes through it."""

from __future__ import annotations

from longctx_core.sizing import placement
from longctx_core.api.operation_types import Placement


def test_a_node_needs_the_gpu_product_and_every_node_selector_label():
    p = Placement(gpuProduct="NVIDIA-H200", nodeSelector={"pool": "long"})
    assert placement.selects(p, {placement.GPU_PRODUCT_LABEL: "NVIDIA-H200", "pool": "long",
                                 "zone": "a"})
    assert not placement.selects(p, {placement.GPU_PRODUCT_LABEL: "NVIDIA-H200"})
    assert not placement.selects(p, {placement.GPU_PRODUCT_LABEL: "NVIDIA-B200", "pool": "long"})
    assert placement.describe(p) == "nvidia.com/gpu.product=NVIDIA-H200, pool=long"
