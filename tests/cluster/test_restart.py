"""Stopping and restarting the operator converges with no duplicate or orphaned
objects, and a fresh operator's full relist (a resync of everything) writes nothing."""

from __future__ import annotations

import json
import time

import pytest
from kopf.testing import KopfRunner

from longctx_core.api import spec as api
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.desired import desired_objects
from tests.cluster import reconciles
from tests.cluster.test_reconcile import children, wait_ready
from tests.conftest import example_cr, kopf_settings, sts_name, wait_for

pytestmark = pytest.mark.cluster
ARGS = ["run", "--all-namespaces", "--standalone", "-m", "longctx_operator.runtime.main"]


def test_operator_restart_mid_reconcile_converges_without_duplicates(cluster, namespace):
    """Stops the operator right after it starts creating children, starts a new one."""
    with KopfRunner(ARGS, settings=kopf_settings(), timeout=60):
        time.sleep(2)
        assert cluster.apply(example_cr("restart"), namespace).returncode == 0
        wait_for(lambda: children(cluster, namespace, "restart"), 30, "the first child")
    partial = children(cluster, namespace, "restart")
    with KopfRunner(ARGS, settings=kopf_settings(), timeout=60) as runner:
        wait_ready(cluster, namespace, "restart")
        final = children(cluster, namespace, "restart")
        pods = cluster.list("pods", namespace, "app.kubernetes.io/instance=restart")
        cluster.kubectl("delete", "lcd", "restart", "-n", namespace)
    assert runner.exit_code == 0
    assert set(partial) <= set(final)
    # Exactly the desired graph: nothing missing, nothing extra, every child owned by the CR.
    cr = example_cr("restart")
    cr["metadata"].update(namespace=namespace, uid="x")
    plan = serving_plan(api.load_spec(cr["spec"]))
    expected = {(o["kind"], o["metadata"]["name"])
                for o in desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=False)}
    assert set(final) == expected, set(final) ^ expected
    assert sorted(p["metadata"]["name"] for p in pods
                  if p["metadata"]["labels"].get("app.kubernetes.io/component") in
                  ("prefill", "decode")) == [f"{sts_name(cr, role)}-0" for role in ("decode",
                                                                                  "prefill")]


def test_a_fresh_operator_relisting_everything_writes_nothing(cluster, namespace):
    with KopfRunner(ARGS, settings=kopf_settings(), timeout=60):
        time.sleep(2)
        assert cluster.apply(example_cr("steady"), namespace).returncode == 0
        wait_ready(cluster, namespace, "steady")
        time.sleep(3)
    before = children(cluster, namespace, "steady")
    cr_before = cluster.get("lcd", "steady", namespace)["metadata"]["resourceVersion"]
    live = [cr for cr in json.loads(cluster.kubectl("get", "lcd", "-A", "-o", "json").stdout)[
        "items"] if not cr["metadata"].get("deletionTimestamp")]
    done = reconciles.in_process()
    with KopfRunner(ARGS, settings=kopf_settings(), timeout=60) as runner:
        # The new operator lists every CR and child and reconciles each.
        reconciles.wait_for_reconciles(reconciles.in_process, done, "the operator's start",
                                       n=len(live))
        after = children(cluster, namespace, "steady")
        cr_after = cluster.get("lcd", "steady", namespace)["metadata"]["resourceVersion"]
        # An unchanged re-apply keeps every resourceVersion: only its Event tells of it.
        rewrites = [e["message"] for e in cluster.list("events", namespace)
                    if e["involvedObject"].get("name") == "steady"
                    and e["reason"] in ("Repaired", "Recreated", "RollingOut", "Progressed")]
        cluster.kubectl("delete", "lcd", "steady", "-n", namespace)
    assert runner.exit_code == 0
    assert after == before
    assert cr_after == cr_before, "the status was rewritten although nothing changed"
    assert rewrites == [], "the relisted children were applied again"
