"""Where an attempt goes: the router while a decode pod of the revision it serves is Ready,
else a Ready prefill engine of that revision (the seed's one-decode shape)."""

from __future__ import annotations

from longctx_core import contract
from longctx_endpoint.upstreams import PD, PREFILL_ONLY, Pod, Target, Upstreams, pod_of


def pod(name: str, component: str, ip: str, ready: bool = True, revision: str = "r1",
        serving: bool = True) -> Pod:
    return Pod(name, component, revision, ip, ready, serving)


def test_p_d_through_a_ready_router_pod_while_a_decode_of_its_revision_is_ready() -> None:
    ups = Upstreams()
    ups.replace([pod("router", "router", "10.0.0.1"), pod("d", "decode", "10.0.0.2"),
                 pod("p", "prefill", "10.0.0.3")])
    assert ups.target() == Target(PD, f"http://10.0.0.1:{contract.VLLM_ROUTER_PORT}")


def test_prefill_only_when_no_decode_of_the_serving_revision_is_ready() -> None:
    ups = Upstreams()
    ups.replace([pod("router", "router", "10.0.0.1"), pod("d", "decode", "10.0.0.2", False),
                 pod("d-old", "decode", "10.0.0.4", revision="r0"),
                 pod("p-left", "prefill", "10.0.0.5", serving=False),
                 pod("p", "prefill", "10.0.0.3")])
    assert ups.target() == Target(PREFILL_ONLY, f"http://10.0.0.3:{contract.SERVING_BASE_PORT}")
    ups.update("d", pod("d", "decode", "10.0.0.2"))
    assert ups.target().route == PD


def test_a_fixed_router_address_and_no_target_at_all() -> None:
    ups = Upstreams(router_url="http://gw.ns.svc:80")
    assert ups.target() == Target(PD, "http://gw.ns.svc:80")
    assert Upstreams().target() is None


def test_pod_of_reads_readiness_and_skips_pods_without_an_ip_or_leaving() -> None:
    obj = {"metadata": {"name": "p", "labels": {
        contract.COMPONENT_LABEL: "prefill", contract.PAIRING_LABEL: "r1",
        contract.SERVING_LABEL: "true"}},
        "status": {"podIP": "10.0.0.3", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_of(obj) == pod("p", "prefill", "10.0.0.3")
    assert pod_of({**obj, "status": {}}) is None
    assert pod_of({**obj, "metadata": {**obj["metadata"], "deletionTimestamp": "x"}}) is None


def test_prefill_only_while_the_router_is_not_ready_either() -> None:
    """vllm-router is not Ready without a decode; its pod still names the revision."""
    ups = Upstreams()
    ups.replace([pod("router", "router", "10.0.0.1", False), pod("d", "decode", "10.0.0.2", False),
                 pod("p-old", "prefill", "10.0.0.6", revision="r0"),
                 pod("p", "prefill", "10.0.0.3")])
    assert ups.target() == Target(PREFILL_ONLY, f"http://10.0.0.3:{contract.SERVING_BASE_PORT}")


def test_nowhere_while_no_prefill_is_ready_once_the_pods_are_listed() -> None:
    ups = Upstreams()
    ups.replace([pod("router", "router", "10.0.0.1"), pod("d", "decode", "10.0.0.2"),
                 pod("p", "prefill", "10.0.0.3", False)])
    assert ups.target() is None
