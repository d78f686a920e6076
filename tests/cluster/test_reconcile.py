"""Level-based reconcile on the real control plane: the full object graph,
scheduling on H200 nodes, drift repair, recreation, no churn, crash loops, Pending pods."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from tests.cluster import reconciles
from tests.conftest import example_cr, revision_of, sts_name, wait_for

pytestmark = pytest.mark.cluster

CHILD_KINDS = ("statefulsets", "services", "configmaps", "poddisruptionbudgets", "deployments",
               "serviceaccounts", "roles", "rolebindings", "inferencepools")


def condition(cluster, namespace, name, type_):
    status = (cluster.get("lcd", name, namespace) or {}).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def wait_ready(cluster, namespace, name="glm", timeout=120):
    return wait_for(lambda: (condition(cluster, namespace, name, "Ready") or {}).get(
        "status") == "True", timeout, f"{name} Ready")


def children(cluster, namespace, name="glm"):
    """(kind, name) -> resourceVersion of every child the operator manages."""
    out = {}
    for kind in CHILD_KINDS:
        for obj in cluster.list(kind, namespace, f"app.kubernetes.io/instance={name},"
                                "app.kubernetes.io/managed-by=longctx-operator"):
            out[(obj["kind"], obj["metadata"]["name"])] = obj["metadata"]["resourceVersion"]
    return out


def test_full_object_graph_of_the_example(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)
    kinds = {kind for kind, _ in children(cluster, namespace)}
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Deployment",
            "ServiceAccount", "Role", "RoleBinding", "InferencePool"} <= kinds
    status = cluster.get("lcd", "glm", namespace)["status"]
    assert status["plan"]["prefill"]["fits"] is True
    assert {c["type"] for c in status["conditions"]} >= {
        "CapacityPlanned", "PrefillReady", "DecodeReady", "RouterReady", "Ready", "Progressing"}
    printed = cluster.kubectl("get", "lcd", "-n", namespace).stdout
    assert "1/1" in printed and "1048576" in printed, printed


def test_drift_is_repaired_and_a_deleted_child_is_recreated(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)
    prefill = sts_name(example_cr(), "prefill")
    sts = cluster.get("statefulset", prefill, namespace)
    original = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/command/2",
              "value": "/etc/longctx/decode.json"}]
    cluster.kubectl("patch", "statefulset", prefill, "-n", namespace, "--type=json",
                    "-p", json.dumps(patch))
    wait_for(lambda: cluster.get("statefulset", prefill, namespace)["spec"]["template"]
             ["spec"]["containers"][0]["command"] == original, 30, "the command restored")

    uid = cluster.get("service", "glm-decode", namespace)["metadata"]["uid"]
    cluster.kubectl("delete", "service", "glm-decode", "-n", namespace)
    recreated = wait_for(lambda: (cluster.get("service", "glm-decode", namespace) or {}).get(
        "metadata", {}).get("uid") not in (None, uid), 30, "the Service recreated")
    assert recreated
    def reasons():  # Kopf posts events asynchronously
        events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
        found = {e["reason"] for e in json.loads(events)["items"]
                 if e["involvedObject"]["kind"] == "LongContextDeployment"}
        return found if {"Repaired", "Recreated"} <= found else None

    wait_for(reasons, 30, "Repaired and Recreated events on the CR")


def operator_writes() -> float:
    """Every API write the in-process operator made (its own counter, by kind and verb)."""
    port = os.environ["LONGCTX_METRICS_PORT"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("longctx_api_writes_total{"))


def test_resyncs_after_convergence_write_nothing(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)

    def touched(value: str) -> None:
        """A label-only touch of the CR, a no-op event on which the operator re-reads
        everything; returns once a reconcile finished after it."""
        done = reconciles.in_process()
        cluster.kubectl("label", "lcd", "glm", "-n", namespace, f"resync={value}",
                        "--overwrite")
        reconciles.wait_for_reconciles(reconciles.in_process, done, f"label resync={value}")

    settles = iter(range(100))

    def converged() -> bool:   # the last status write is behind us once a reconcile writes none
        writes = operator_writes()
        touched(f"settle{next(settles)}")
        return operator_writes() == writes

    wait_for(converged, 60, "a reconcile that writes nothing", interval=0)
    writes_before = operator_writes()
    before = children(cluster, namespace)
    cr_version = cluster.get("lcd", "glm", namespace)["metadata"]["resourceVersion"]
    for i in range(5):
        touched(f"r{i}")
    after = children(cluster, namespace)
    assert after == before, {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
    # Not even no-op patches: the operator compares before it writes.
    assert operator_writes() == writes_before
    managed = json.loads(cluster.kubectl("get", "lcd", "glm", "-n", namespace, "-o", "json",
                                         "--show-managed-fields").stdout)["metadata"]["managedFields"]
    status_writes = [m for m in managed if m.get("subresource") == "status"]
    assert status_writes, "the operator wrote the status at least once"
    # The CR changed only through the labels above, never through its status.
    latest = cluster.get("lcd", "glm", namespace)
    assert latest["status"]["phase"] == "Ready"
    assert int(latest["metadata"]["resourceVersion"]) > int(cr_version)


def test_crash_looping_engine_turns_the_cr_degraded(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)
    pod = f"{sts_name(example_cr(), 'decode')}-0"
    crash = {"status": {"containerStatuses": [{
        "name": "engine", "ready": False, "restartCount": 6, "image": "x", "imageID": "",
        "started": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                     "message": "free /dev/shm 64 GiB < 128 GiB offload"}}}]}}
    cluster.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status",
                    "--type=strategic", "-p", json.dumps(crash))
    degraded = wait_for(lambda: (c := condition(cluster, namespace, "glm", "Degraded")) and
                        c["status"] == "True" and c, 30, "Degraded")
    assert "/dev/shm" in degraded["message"] and "Error" in degraded["message"]
    assert cluster.get("lcd", "glm", namespace)["status"]["phase"] == "Degraded"


def test_too_few_gpus_leaves_pods_pending_with_a_reason(cluster, operator, namespace):
    nodes = len(cluster.list("nodes", "default"))
    cr = example_cr("big", prefill__replicas=nodes + 2)
    assert cluster.apply(cr, namespace).returncode == 0

    def unschedulable():
        c = condition(cluster, namespace, "big", "PrefillReady")
        return c if c and c["reason"] == "Unschedulable" else None

    cond = wait_for(unschedulable, 60, "PrefillReady=Unschedulable")
    assert "nvidia.com/gpu" in cond["message"], cond
    ready = condition(cluster, namespace, "big", "Ready")
    assert ready["status"] == "False" and "nvidia.com/gpu" in ready["message"]
    cluster.kubectl("delete", "lcd", "big", "-n", namespace, "--wait=false")


def test_operator_metrics(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)
    port = os.environ["LONGCTX_METRICS_PORT"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("longctx_")}
    assert samples['longctx_reconciles_total{result="ok"}'] > 0
    assert samples["longctx_reconcile_duration_seconds_count"] > 0
    assert samples['longctx_api_writes_total{kind="StatefulSet",verb="apply"}'] >= 2
    assert samples['longctx_managed_objects{kind="StatefulSet"}'] == 2
    assert samples['longctx_deployments{phase="Ready"}'] >= 1


POD_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor",
                       "listKind": "PodMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_pod_monitor_only_when_its_crd_exists_and_monitoring_is_on(cluster, operator, namespace):
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_ready(cluster, namespace)
    assert cluster.kubectl("get", "crd", "podmonitors.monitoring.coreos.com",
                           check=False).returncode != 0, "the CRD must start absent"
    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(POD_MONITOR_CRD))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/podmonitors.monitoring.coreos.com")
        cluster.kubectl("label", "lcd", "glm", "-n", namespace, "poke=1")  # an event
        monitor = wait_for(lambda: cluster.get("podmonitor", "glm", namespace), 30,
                           "the PodMonitor")
        ports = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
        assert {"vllm-0", "vllm-7"} <= ports
        off = example_cr()
        off["spec"]["monitoring"] = {"podMonitor": False}
        assert cluster.apply(off, namespace).returncode == 0
        wait_for(lambda: cluster.get("podmonitor", "glm", namespace) is None, 30,
                 "the PodMonitor removed")
    finally:
        cluster.kubectl("delete", "crd", "podmonitors.monitoring.coreos.com", "--wait=false",
                        check=False)
