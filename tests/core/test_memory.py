"""The HiSparse host pool: `hostPoolPerRank: auto` is the least pool that holds
requestsPerRank max-context requests by vLLM's rule, resolved to bytes once, by the capacity
plan (memory.hisparse_pool_per_rank), whose figure the pod's memory, host_pool_gib and the
capacity rules read."""

from __future__ import annotations

import json
import re

import pytest

from longctx_core.api import role_types as api_roles, schema
from longctx_core import quantity
from longctx_core.sizing import kv_sizing, memory, models, planner
from longctx_core.plan.roles import serving_plan
from tests.engine_pods import pod, pod_command
from tests.core.planner_support import ONE_M, spec_with

GLM = models.PRESETS["glm-5.3"]


def test_auto_is_the_crd_default():
    assert api_roles.HiSparse().hostPoolPerRank == quantity.AUTO
    assert api_roles.HiSparse().requestsPerRank == 1
    field = schema.object_schema(api_roles.HiSparse)["properties"]["hostPoolPerRank"]
    assert field["default"] == "auto"


def test_only_the_pool_admits_auto_in_the_crd():
    pool = schema.object_schema(api_roles.HiSparse)["properties"]["hostPoolPerRank"]["pattern"]
    offload = schema.object_schema(api_roles.Decode)["properties"]["cpuOffloadPerRank"]["pattern"]
    for value, ok in (("auto", True), ("51Gi", True), ("1.5Ti", True), ("autoGi", False),
                      ("Auto", False), ("48 Gi", False)):
        assert bool(re.match(pool, value)) is ok, value
    assert re.match(offload, "16Gi") and not re.match(offload, "auto")


@pytest.mark.parametrize("requests", [1, 2, 5])
def test_auto_holds_exactly_the_declared_requests_and_no_less_pool_would(requests):
    spec = spec_with(decode={"hiSparse": {"hostPoolPerRank": "auto",
                                          "requestsPerRank": requests}})
    pool = memory.hisparse_pool_per_rank(spec)
    page = memory.hisparse_page_bytes(GLM)
    # vLLM's rule for one request: cdiv(max_model_len, 64) + 2 pages.
    assert pool == (requests * -(-ONE_M // 64) + 2) * page
    assert kv_sizing.hisparse_host_requests(GLM, pool, ONE_M) == requests
    assert kv_sizing.hisparse_host_requests(GLM, pool - page, ONE_M) == requests - 1
    plan = planner.plan(spec)
    assert plan.decode.hisparse.host_pool_bytes == pool
    assert plan.decode.hisparse.host_pool_requests == requests
    assert plan.decode.to_json()["hiSparse"]["hostPoolGiBPerRank"] == round(pool / quantity.GiB, 2)


def test_the_pod_memory_and_host_pool_gib_read_the_resolved_pool(monkeypatch):
    spec = spec_with(decode={"hiSparse": {"hostPoolPerRank": "auto"}})
    pool = memory.hisparse_pool_per_rank(spec)
    serving_plan(spec)   # the performance model's own plans, made once per distinct spec
    resolved = []
    monkeypatch.setattr(planner, "hisparse_pool_per_rank",
                        lambda s: resolved.append(s) or memory.hisparse_pool_per_rank(s))
    plan = serving_plan(spec)
    decode = plan.decode
    # Resolved once, by the capacity plan; the role plan carries that same figure, which the
    # capacity rules (plan.capacity) read too.
    assert len(resolved) == 1
    assert decode.capacity is plan.capacity.decode and decode.capacity.hisparse_pool_bytes == pool
    assert decode.memory == memory.pod_memory(spec, decode.layout, pool)
    explicit = serving_plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": str(pool)}}))
    assert explicit.decode.memory == decode.memory
    argv = pod_command(decode, pod("decode")).argv
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    (hisparse,) = [c for c in config["kv_connector_extra_config"]["connectors"]
                   if c["kv_connector"] == "HiSparseConnector"]
    # vLLM reads the pool as int(host_pool_gib * 2**30) (vllm/v1/hisparse/layout.py).
    assert int(hisparse["kv_connector_extra_config"]["host_pool_gib"] * 2**30) == pool


def test_a_too_small_pool_is_refused_with_the_least_that_fits():
    plan = planner.plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": "48Gi"}}))
    assert not plan.fits
    (offered,) = re.findall(r"hostPoolPerRank to at least (\d+Gi) \(or to auto\)", plan.refusal)
    assert planner.plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": offered}})).fits
