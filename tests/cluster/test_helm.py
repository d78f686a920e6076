"""`helm install`, `helm upgrade` and `helm uninstall` of charts/longctx with the real helm
binary against the real local API server.

CRDs: the session fixture has already applied the LongContextDeployment CRD (every cluster
test needs it), so Helm's crds/ step finds it and skips it, exactly as it does on any
cluster where the CRD exists (Helm never upgrades or deletes crds/). What these tests
prove about the CRDs: Kopf's peering CRDs are created by `helm install` from crds/, the
existing LongContextDeployment CRD is left untouched, and `helm uninstall` leaves all CRDs
in place. That the chart's copy of the CRD is valid and identical to the generator is
shown by tests/helm (`helm template --include-crds` + a server-side dry run), since a
fresh-cluster install is not possible inside the shared session cluster.

There is no container runtime: kwok marks the operator's pod Running and Ready, so
`--wait` succeeds once the API objects are right (the real process runs in test_rbac.py).
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.conftest import wait_for
from tests.helm.chart import CHART

pytestmark = pytest.mark.cluster

LCD_CRD = "customresourcedefinitions/longcontextdeployments.longctx.dev"
KOPF_CRDS = ("customresourcedefinitions/kopfpeerings.kopf.dev",
             "customresourcedefinitions/clusterkopfpeerings.kopf.dev")
# Everything the chart can create, namespaced and cluster-scoped.
NAMESPACED_KINDS = ("deployments", "replicasets", "pods", "services", "serviceaccounts",
                    "roles", "rolebindings", "kopfpeerings.kopf.dev")
CLUSTER_KINDS = ("clusterroles", "clusterrolebindings", "clusterkopfpeerings.kopf.dev")


def release_objects(cluster, release: str, namespaces: list[str]) -> list[str]:
    selector = f"app.kubernetes.io/instance={release}"
    found = []
    for kind in NAMESPACED_KINDS:
        for ns in namespaces:
            out = cluster.kubectl("get", kind, "-n", ns, "-l", selector, "-o", "name",
                                  check=False).stdout.split()
            found += [f"{ns}/{name}" for name in out]
    for kind in CLUSTER_KINDS:
        found += cluster.kubectl("get", kind, "-l", selector, "-o", "name",
                                 check=False).stdout.split()
    return found


def restricted(cluster, namespace: str) -> None:
    """Pod Security 'restricted' enforced: the API server refuses a non-compliant pod."""
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=restricted", "--overwrite")


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_install_upgrade_uninstall(cluster, namespace, mode):
    release = f"lc-{uuid.uuid4().hex[:6]}"
    fullname = f"{release}-longctx"
    restricted(cluster, namespace)
    watch_args = ["--set", f"watchNamespace={namespace}"] if mode == "namespaced" else []
    crd_before = cluster.get(LCD_CRD.split("/")[0], LCD_CRD.split("/")[1])

    # ---- install
    proc = cluster.helm("install", release, str(CHART), "--namespace", namespace,
                        *watch_args, "--wait", "--timeout", "120s")
    assert "STATUS: deployed" in proc.stdout, proc.stdout
    assert "kubectl apply -f examples/glm-5.3-1m.yaml" in proc.stdout  # NOTES
    crd_after = cluster.get(LCD_CRD.split("/")[0], LCD_CRD.split("/")[1])
    assert crd_after["metadata"]["resourceVersion"] == crd_before["metadata"]["resourceVersion"]
    for crd in KOPF_CRDS:
        assert cluster.kubectl("get", crd, check=False).returncode == 0, crd

    dep = cluster.get("deployment", fullname, namespace)
    assert dep["status"].get("readyReplicas") == 1, dep["status"]
    pod_spec = dep["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == fullname
    (pod,) = cluster.list("pods", namespace, f"app.kubernetes.io/instance={release}")
    assert pod["status"]["phase"] == "Running"  # admitted under Pod Security 'restricted'
    assert cluster.get("service", f"{fullname}-metrics", namespace)["spec"]["ports"][0][
        "name"] == "metrics"
    assert cluster.get("serviceaccount", fullname, namespace) is not None
    if mode == "cluster-wide":
        assert cluster.get("clusterrole", fullname) is not None
        assert cluster.get("clusterrolebinding", fullname) is not None
        assert cluster.get("role", fullname, namespace) is None
    else:
        assert cluster.get("role", fullname, namespace) is not None
        assert cluster.get("rolebinding", fullname, namespace) is not None
        assert cluster.get("clusterrole", fullname) is None
        assert cluster.get("clusterrole", f"{fullname}-cluster-reads") is not None
    status = json.loads(cluster.helm("status", release, "-n", namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 1

    # ---- upgrade: two replicas with Kopf peering
    proc = cluster.helm("upgrade", release, str(CHART), "--namespace", namespace,
                        "--reuse-values", "--set", "replicas=2", "--wait", "--timeout", "120s")
    assert "STATUS: deployed" in proc.stdout and "REVISION: 2" in proc.stdout, proc.stdout
    dep = cluster.get("deployment", fullname, namespace)
    assert dep["spec"]["replicas"] == 2 and dep["status"].get("readyReplicas") == 2
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert f"--peering={fullname}" in container["args"]
    if mode == "cluster-wide":
        peering = cluster.get("clusterkopfpeerings.kopf.dev", fullname)
        rules = cluster.get("clusterrole", fullname)["rules"]
        assert any("clusterkopfpeerings" in r["resources"] for r in rules)
    else:
        peering = cluster.get("kopfpeerings.kopf.dev", fullname, namespace)
        assert f"--namespace={namespace}" in container["args"]
    assert peering is not None

    # ---- uninstall: nothing of the release is left; the CRDs stay
    cluster.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
    wait_for(lambda: not release_objects(cluster, release, [namespace]) or None, 60,
             "every object of the release to be gone", interval=1)
    assert cluster.helm("status", release, "-n", namespace, check=False).returncode != 0
    for crd in (LCD_CRD, *KOPF_CRDS):
        assert cluster.kubectl("get", crd, check=False).returncode == 0, f"{crd} was removed"
