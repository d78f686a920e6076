"""Host memory: each pod's host memory against the largest node the placement selects, the
GPU figures against the nodes' GPUs, and a refusal that offers a value that fits."""

from __future__ import annotations

import pytest

from longctx_core.sizing import host_memory, placement, planner
from tests.core.planner_support import offered_value, spec_with


def _node(name: str, memory: str, gpu_mib: str | None = None, **labels: str) -> host_memory.NodeMemory:
    meta_labels = {placement.GPU_PRODUCT_LABEL: "NVIDIA-H200", **labels}
    if gpu_mib:
        meta_labels[host_memory.GPU_MEMORY_LABEL] = gpu_mib
    return host_memory.NodeMemory.from_manifest({"metadata": {"name": name, "labels": meta_labels},
                                             "status": {"allocatable": {"memory": memory}}})


def test_offline_the_host_memory_is_not_checked_and_the_plan_says_so():
    plan = planner.plan(spec_with())
    assert plan.fits and plan.host_memory["checked"] is False
    assert any("host memory per pod was not checked" in n for n in plan.notes)


def test_the_example_fits_the_largest_selected_node():
    plan = planner.plan(spec_with(), [_node("small", "64Gi"), _node("big", "2Ti")])
    assert plan.fits, plan.refusal
    assert plan.host_memory["largestAllocatableGiB"] == 2048
    assert plan.host_memory["prefillPodGiB"] < 2048 and plan.host_memory["decodePodGiB"] < 2048


@pytest.mark.parametrize("change, field", [
    ({"prefill": {"cpuOffloadPerRank": "1Ei"}}, "spec.prefill.cpuOffloadPerRank (1Ei)"),
    ({"decode": {"hiSparse": {"hostPoolPerRank": "1Pi"}}},
     "spec.decode.hiSparse.hostPoolPerRank (1Pi)"),
    ({"decode": {"cpuOffloadPerRank": "300Gi"}}, "spec.decode.cpuOffloadPerRank (300Gi)"),
])
def test_a_pod_larger_than_every_selected_node_is_refused_naming_the_field(change, field):
    plan = planner.plan(spec_with(**change), [_node("h200-0", "1Ti"), _node("h200-1", "2Ti")])
    assert not plan.fits and plan.reason == "InsufficientHostMemory"
    assert field in plan.refusal
    assert "(h200-1, nvidia.com/gpu.product=NVIDIA-H200) has 2048.0 GiB allocatable" in \
        plan.refusal, plan.refusal


def test_only_the_nodes_the_placement_selects_count():
    nodes = [_node("other", "64Ti", **{placement.GPU_PRODUCT_LABEL: "NVIDIA-B200"}),
             _node("h200", "256Gi")]
    plan = planner.plan(spec_with(), nodes)
    assert not plan.fits and "(h200," in plan.refusal
    pool = spec_with(placement={"nodeSelector": {"pool": "long"}})
    skipped = planner.plan(pool, nodes)
    assert skipped.fits and skipped.host_memory["checked"] is False
    assert any("no node matches the placement" in n for n in skipped.notes)


def test_gpu_figures_are_bounded_by_the_gpu():
    labelled = [_node("h200", "2Ti", gpu_mib="143771")]
    plan = planner.plan(spec_with(capacity={"gpuMemory": "1Ei"}), labelled)
    assert not plan.fits and "spec.capacity.gpuMemory (1Ei" in plan.refusal
    for capacity, field in (({"kvBudgetPerGpu": "1Ti"}, "spec.capacity.kvBudgetPerGpu (1Ti)"),
                            ({"activationReservePerGpu": "1Ti"},
                             "spec.capacity.activationReservePerGpu (1Ti)")):
        offline = planner.plan(spec_with(capacity=capacity))
        assert not offline.fits and field in offline.refusal, offline.refusal


# ------------------------------------------------------------ every refusal offers a value that fits


@pytest.mark.parametrize("change", [{"decode": {"cpuOffloadPerRank": "300Gi"}},
                                    {"decode": {"hiSparse": {"hostPoolPerRank": "200Gi"}}}])
def test_a_pod_too_large_for_the_nodes_is_refused_with_a_value_that_fits(change):
    nodes = [_node("h200", "1Ti")]
    plan = planner.plan(spec_with(**change), nodes)
    assert not plan.fits
    value = offered_value(r"lower it to at most (\d+Gi)", plan.refusal)
    ((role, fields),) = change.items()
    ((name, old),) = fields.items()
    fixed = {role: {name: {"hostPoolPerRank": value} if isinstance(old, dict) else value}}
    assert planner.plan(spec_with(**fixed), nodes).fits


def test_an_auto_pool_too_large_for_the_nodes_is_refused_with_the_requests_that_fit():
    nodes = [_node("h200", "1Ti")]
    spec = spec_with(decode={"hiSparse": {"hostPoolPerRank": "auto", "requestsPerRank": 3}})
    plan = planner.plan(spec, nodes)
    assert not plan.fits and "hostPoolPerRank (auto = " in plan.refusal
    requests = int(offered_value(r"requestsPerRank \(3\) to at most (\d+)", plan.refusal))
    assert planner.plan(spec_with(decode={"hiSparse": {"requestsPerRank": requests}}),
                        nodes).fits


def test_a_node_without_a_memory_quantity_is_ignored():
    assert host_memory.NodeMemory.from_manifest({"metadata": {"name": "x"}, "status": {}}) is None
