"""vllm-router's Deployment (builders/vllm_router.py) as a drain needs it: discovery only of
pods in the pool, a roll when a scale-down takes pods out, and when a roll is over."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx_core import contract
from longctx_core.api.schema import SpecError
from longctx_core.api.spec import load_spec
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.builders import vllm_router
from longctx_operator.controller.routers import router_for

REPO = Path(__file__).resolve().parents[2]
CR = yaml.safe_load((REPO / "examples" / "tiny-mla-cpu.yaml").read_text())
CR["metadata"] = {"name": "tiny", "namespace": "ml", "uid": "u-1"}
PLAN = serving_plan(load_spec(CR["spec"]))


def deployment() -> dict[str, Any]:
    (dep,) = [o for o in vllm_router.vllm_router_objects(CR, PLAN) if o["kind"] == "Deployment"]
    return dep


def test_discovery_selects_only_pods_in_the_pool_of_the_revision():
    args = deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    for flag, role in (("--prefill-selector", "prefill"), ("--decode-selector", "decode")):
        at = args.index(flag)
        labels = dict(a.split("=", 1) for a in args[at + 1:at + 6])
        assert labels == {**contract.selector_labels("tiny", role, PLAN.revision),
                          contract.SERVING_LABEL: "true"}
        # A pod a scale-down marks draining no longer matches.
        draining = {**contract.labels("tiny", role, PLAN.revision),
                    contract.SERVING_LABEL: "draining"}
        assert not labels.items() <= draining.items()


def live(dep: dict[str, Any], generation: int = 2, observed: int = 2, replicas: int = 1,
         updated: int = 1, available: int = 1) -> dict[str, Any]:
    out = copy.deepcopy(dep)
    out["metadata"]["generation"] = generation
    out["status"] = {"observedGeneration": observed, "replicas": replicas,
                     "updatedReplicas": updated, "availableReplicas": available}
    return out


def draining(pods: list[str]) -> dict[str, Any]:
    (dep,) = [o for o in vllm_router.vllm_router_objects(CR, PLAN, None, tuple(pods))
              if o["kind"] == "Deployment"]
    return dep


ROLLED = [
    ("rolled out", ["b", "a"], live(draining(["a", "b"])), True),
    ("no live Deployment", ["a"], None, False),
    ("the template still names other pods", ["a"], live(draining(["b"])), False),
    ("the template has not been applied", ["a"], live(deployment()), False),
    ("the controller has not seen the new generation", ["a"],
     live(draining(["a"]), observed=1), False),
    ("an old router pod still runs beside the new one", ["a"],
     live(draining(["a"]), replicas=2), False),
    ("the new router pod is not yet available", ["a"],
     live(draining(["a"]), available=0), False),
    ("nothing draining: a stale annotation of an earlier scale-down does not count",
     None, live(draining(["old-1"])), True),
]


@pytest.mark.parametrize("case", ROLLED, ids=[c[0] for c in ROLLED])
def test_rolled_out(case):
    _, pods, live_dep, expected = case
    assert vllm_router.rolled_out(live_dep, PLAN.revision, pods) is expected


def test_a_router_discovering_another_revision_has_not_rolled_out():
    other = live(deployment())
    other["spec"]["template"]["metadata"]["labels"][contract.PAIRING_LABEL] = "other"
    assert not vllm_router.rolled_out(other, PLAN.revision)


def test_a_node_drain_names_the_nodes_to_leave_on_the_template():
    (dep,) = [o for o in vllm_router.vllm_router_objects(CR, PLAN, None, (), ("n2", "n1"))
              if o["kind"] == "Deployment"]
    assert vllm_router.leaving_nodes(dep) == ["n1", "n2"]
    assert vllm_router.leaving_nodes(deployment()) == []


def test_a_leaving_router_pod_serves_what_it_holds_for_the_request_timeout():
    """preStop sleeps the request timeout before SIGTERM (the endpoint is gone at once), and
    the grace period covers the sleep."""
    pod = deployment()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    timeout = PLAN.prefill.faults.request_timeout_seconds
    args = container["args"]
    assert args[args.index("--request-timeout-secs") + 1] == str(timeout)
    assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": timeout}}
    assert pod["terminationGracePeriodSeconds"] > timeout


def test_router_pods_follow_the_engines_or_their_own_placement():
    import copy
    from longctx_core.api.spec import load_spec
    from longctx_core.plan.roles import serving_plan
    from longctx_operator.controller.routers import router_for

    def pod_spec(cr, kind="Deployment"):
        plan = serving_plan(load_spec(cr["spec"]), cr["metadata"]["name"])
        (dep,) = [o for o in router_for(plan.spec).objects(cr, plan, plan.revision)
                  if o["kind"] == kind]
        return dep["spec"]["template"]["spec"]
    cr = copy.deepcopy(CR)
    cr["spec"]["placement"] = {"nodeSelector": {"pool": "engines"},
                               "tolerations": [{"key": "t", "operator": "Exists"}]}
    spec = pod_spec(cr)
    assert spec["nodeSelector"] == {"pool": "engines"} and spec["tolerations"][0]["key"] == "t"
    cr["spec"]["router"]["placement"] = {"nodeSelector": {"pool": "routers"}}
    assert pod_spec(cr)["nodeSelector"] == {"pool": "routers"}
    assert "tolerations" not in pod_spec(cr)
    cr["spec"]["router"]["type"] = "llm-d"
    assert pod_spec(cr)["nodeSelector"] == {"pool": "routers"}   # the endpoint picker's


@pytest.mark.parametrize("affinity, policy", [(None, "cache_aware"),
                                              ("prefix", "cache_aware"),
                                              ("sessionId", "sticky_least_loaded")])
def test_session_affinity_picks_the_routing_policy(affinity, policy):
    cr = copy.deepcopy(CR)
    if affinity is not None:
        cr["spec"]["router"]["sessionAffinity"] = affinity
    plan = serving_plan(load_spec(cr["spec"]))
    args = vllm_router.router_args(cr, plan, plan.revision)
    assert args[args.index("--policy") + 1] == policy and "--prefill-policy" not in args


def test_session_affinity_by_id_is_refused_for_llm_d_naming_the_fix():
    spec = load_spec({**CR["spec"], "router": {"type": "llm-d", "sessionAffinity": "sessionId"}})
    with pytest.raises(SpecError, match=r"spec.router.sessionAffinity='sessionId'.*Set "
                                        r"spec.router.sessionAffinity to prefix"):
        router_for(spec)
