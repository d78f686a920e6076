"""A CR on the real control plane becomes owned StatefulSets and Services whose
pods run on simulated H200 nodes; the API server itself rejects invalid CRs."""

from __future__ import annotations

import pytest

from tests.conftest import example_cr, revision_of, sts_name, wait_for

pytestmark = pytest.mark.cluster


def test_the_api_server_is_real(cluster):
    version = cluster.cp.version()
    assert version == "v1.37.2", version
    nodes = cluster.list("nodes", "default")
    gpus = [n for n in nodes if n["status"]["allocatable"].get("nvidia.com/gpu") == "8"
            and n["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"]
    assert len(gpus) == len(nodes) >= 2


def test_cr_becomes_running_statefulsets_and_is_garbage_collected(cluster, operator, namespace):
    cr = example_cr("glm")
    assert cluster.apply(cr, namespace).returncode == 0
    lcd = wait_for(lambda: cluster.get("lcd", "glm", namespace), 10, "the CR")
    uid = lcd["metadata"]["uid"]

    for role in ("prefill", "decode"):
        sts = wait_for(lambda: cluster.get("statefulset", sts_name(cr, role), namespace), 60,
                       f"StatefulSet {sts_name(cr, role)}")
        svc = cluster.get("service", f"glm-{role}", namespace)
        assert svc["spec"]["clusterIP"] == "None"
        for obj in (sts, svc):
            (owner,) = obj["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"], owner["controller"]) == (
                "LongContextDeployment", uid, True)

    def running_pods():
        pods = cluster.list("pods", namespace, "app.kubernetes.io/instance=glm,"
                            "app.kubernetes.io/component in (prefill,decode)")
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(running) == 2 else None

    pods = wait_for(running_pods, 90, "both engine pods Running")
    for pod in pods:
        node = cluster.get("node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pods[0]["spec"]["nodeName"] != pods[1]["spec"]["nodeName"]  # 8 GPUs each: one per node

    def ready():
        status = (cluster.get("lcd", "glm", namespace) or {}).get("status", {})
        conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return status if conds.get("Ready") == "True" else None

    status = wait_for(ready, 120, "the CR's Ready condition")
    assert status["prefill"]["readyReplicas"] == 1 and status["decode"]["readyReplicas"] == 1
    assert status["phase"] == "Ready"
    assert status["observedGeneration"] == lcd["metadata"]["generation"]

    cluster.kubectl("delete", "lcd", "glm", "-n", namespace)

    def all_gone():
        left = [k for k in (f"statefulset/{sts_name(cr, 'prefill')}",
                            f"statefulset/{sts_name(cr, 'decode')}", "service/glm-prefill",
                            "service/glm-decode", f"configmap/glm-engine-{revision_of(cr)}")
                if cluster.kubectl("get", k, "-n", namespace, check=False).returncode == 0]
        return not left or None

    wait_for(all_gone, 120, "garbage collection of every child", interval=2)


@pytest.mark.parametrize("mutate, field", [
    (lambda cr: cr["spec"].pop("maxContextTokens"), "spec.maxContextTokens"),
    (lambda cr: cr["spec"]["prefill"].__setitem__("replicas", -1), "spec.prefill.replicas"),
    (lambda cr: cr["spec"]["model"].pop("name"), "spec.model.name"),
])
def test_api_server_rejects_invalid_cr_naming_the_field(cluster, namespace, mutate, field):
    cr = example_cr("bad")
    mutate(cr)
    proc = cluster.apply(cr, namespace)
    assert proc.returncode != 0
    assert field in proc.stderr, proc.stderr
    assert cluster.get("lcd", "bad", namespace) is None
