"""`helm template` output (both RBAC modes) and the kustomize base, applied to the real
local API server with `kubectl apply --server-side --dry-run=server`: the API server runs
schema validation, defaulting, RBAC escalation checks and admission on every object
without storing it."""

from __future__ import annotations

import os
import uuid

import pytest
import yaml

from tests.helm.chart import KUSTOMIZE_BASE, documents, helm_binary, template_text

pytestmark = pytest.mark.cluster


def dry_run(cluster, docs: list[dict]) -> list[str]:
    proc = cluster.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server",
                           "--field-manager=longctx-chart-test", "-f", "-",
                           input=yaml.safe_dump_all(docs), check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == len(docs), proc.stdout
    assert all(line.endswith("serverside-applied (server dry run)") for line in lines), lines
    return lines


def ensure_kopf_crds(cluster, docs: list[dict]) -> None:
    """The peering objects need Kopf's CRDs to exist (a dry run stores nothing): create
    them for real, as `helm install` would. They are cluster-scoped and harmless."""
    kopf = [d for d in docs if d["kind"] == "CustomResourceDefinition"
            and d["spec"]["group"] == "kopf.dev"]
    cluster.kubectl("apply", "--server-side", "--field-manager=longctx-chart-test", "-f", "-",
                    input=yaml.safe_dump_all(kopf))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    *(f"crd/{d['metadata']['name']}" for d in kopf))


@pytest.fixture
def watched_namespace(cluster):
    name = f"w-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_helm_template_output_passes_a_server_side_dry_run(cluster, namespace,
                                                          watched_namespace, tmp_path, mode):
    values = {"replicas": 2, "metrics.serviceMonitor.enabled": False}
    if mode == "namespaced":
        values["watchNamespace"] = watched_namespace
    release = f"dry-{uuid.uuid4().hex[:6]}"
    docs = documents(template_text(helm_binary(), tmp_path, values, release=release,
                                   namespace=namespace, include_crds=True))
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in crds} == {
        "longcontextdeployments.longctx.dev", "kopfpeerings.kopf.dev",
        "clusterkopfpeerings.kopf.dev"}

    dry_run(cluster, crds)
    ensure_kopf_crds(cluster, crds)
    lines = dry_run(cluster, rest)
    kinds = {d["kind"] for d in rest}
    expected = {"ServiceAccount", "Service", "Deployment", "ConfigMap"}  # ConfigMap: dashboards
    if mode == "cluster-wide":
        expected |= {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}
    else:
        expected |= {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "KopfPeering"}
    assert kinds == expected, kinds
    # Nothing was stored.
    assert cluster.get("deployment", release, namespace) is None, lines


def test_kustomize_base_passes_a_server_side_dry_run(cluster, namespace, tmp_path):
    """An overlay that moves the base into another namespace, as a user would."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE_BASE, overlay)], "namespace": namespace,
        "images": [{"name": "ghcr.io/longctx/longctx-operator", "newTag": "0.1.0-test"}]}))
    proc = cluster.kubectl("kustomize", str(overlay), check=False)
    assert proc.returncode == 0, proc.stderr
    docs = documents(proc.stdout)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["Namespace", "CustomResourceDefinition",
                            "CustomResourceDefinition", "CustomResourceDefinition",
                            "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service",
                            "Deployment", *["ConfigMap"] * 5]), kinds  # 5 dashboards
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"][0]["namespace"] == namespace
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["metadata"]["namespace"] == namespace
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.1.0-test")
    assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kustomize"
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    dry_run(cluster, crds)
    ensure_kopf_crds(cluster, crds)
    dry_run(cluster, [d for d in docs if d["kind"] != "CustomResourceDefinition"])


@pytest.mark.parametrize("watch", [False, True])
def test_notes_tell_the_next_commands(cluster, namespace, watch):
    """NOTES.txt as `helm install --dry-run=server` prints it (helm template omits NOTES)."""
    from tests.helm.chart import CHART

    args = ["--set", f"watchNamespace={namespace}"] if watch else []
    proc = cluster.helm("install", "notes", str(CHART), "--namespace", namespace,
                        "--dry-run=server", *args)
    notes = proc.stdout.split("NOTES:", 1)[1]
    suffix = f" -n {namespace}" if watch else ""
    for command in (f"kubectl apply -f examples/glm-5.3-1m.yaml{suffix}",
                    f"kubectl get lcd{suffix}", "longctx plan -f examples/glm-5.3-1m.yaml",
                    f"kubectl -n {namespace} rollout status deployment/notes-longctx"):
        assert command in notes, notes
    assert cluster.get("deployment", "notes-longctx", namespace) is None
