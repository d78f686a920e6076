"""Whether a topology domain of the cluster's nodes can hold one P/D unit."""

from __future__ import annotations

from longctx_core.sizing.host_memory import NodeMemory
from longctx_core.sizing.topology import topology_plan
from tests.contract.variants import spec_with

KEY = "example.com/rack"


def _spec(key: str | None = KEY, prefill: int = 1, decode: int = 1):
    def edit(d: dict) -> None:
        if key:
            d.setdefault("placement", {})["topologyKey"] = key
        d["scaling"] = {"prefillPerUnit": prefill, "decodePerUnit": decode}
    return spec_with(edit)


def _node(name: str, rack: str | None, product: str = "NVIDIA-H200") -> NodeMemory:
    labels = {"nvidia.com/gpu.product": product}
    if rack:
        labels[KEY] = rack
    return NodeMemory(name, labels, 2 << 40)


def test_no_key_no_plan():
    assert topology_plan(_spec(None), [_node("a", "r1")]) is None


def test_a_domain_with_a_units_nodes_satisfies():
    topo = topology_plan(_spec(), [_node("a", "r1"), _node("b", "r1"), _node("c", "r2")])
    assert topo.satisfiable and topo.problem is None
    assert topo.to_json() == {"topologyKey": KEY, "unitNodes": 2,
                              "domains": {"r1": 2, "r2": 1}, "satisfiable": True}


def test_no_node_with_the_key_is_refused_by_name():
    topo = topology_plan(_spec(), [_node("a", None), _node("b", None)])
    assert topo.satisfiable is False
    assert f"spec.placement.topologyKey is {KEY}, but none of the 2 nodes" in topo.problem
    assert f"kubectl label node <node> {KEY}=<domain>" in topo.problem


def test_domains_too_small_for_a_unit_name_the_largest():
    nodes = [_node("a", "r1"), _node("b", "r1"), _node("c", "r2")]
    topo = topology_plan(_spec(prefill=1, decode=2), nodes)
    assert topo.satisfiable is False
    assert "a unit needs 3 nodes in one domain" in topo.problem
    assert f"the largest domain, {KEY}=r1, has 2" in topo.problem


def test_only_the_nodes_the_placement_selects_count():
    nodes = [_node("a", "r1"), _node("b", "r1", product="NVIDIA-A100")]
    assert topology_plan(_spec(), nodes).satisfiable is False


def test_unknown_nodes_leave_it_unknown():
    topo = topology_plan(_spec(), None)
    assert topo.satisfiable is None and "satisfiable" not in topo.to_json()
