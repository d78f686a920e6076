"""The chart, offline, with the real helm binary: lint, render in both RBAC modes, the
values schema, the CRDs (one source of truth) and the generated kustomize base."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm.chart import (CHART, KUSTOMIZE_BASE, KUSTOMIZE_SCRIPT, by_kind, documents,
                              grants, helm_binary, run_helm, template_text)

RBAC = "rbac.authorization.k8s.io"
CRUD = ("get", "list", "watch", "create", "patch", "delete")

# Exactly what the operator may do in a namespace it serves (the same in both modes).
NAMESPACED = {
    ("longctx.dev", "longcontextdeployments"): ("get", "list", "watch"),
    ("longctx.dev", "longcontextdeployments/status"): ("patch",),
    ("", "configmaps"): CRUD, ("", "services"): CRUD, ("", "serviceaccounts"): CRUD,
    ("apps", "statefulsets"): CRUD, ("apps", "deployments"): CRUD,
    ("policy", "poddisruptionbudgets"): CRUD, ("networking.k8s.io", "networkpolicies"): CRUD,
    (RBAC, "roles"): CRUD, (RBAC, "rolebindings"): CRUD,
    ("inference.networking.k8s.io", "inferencepools"): CRUD,
    ("gateway.networking.k8s.io", "httproutes"): CRUD,
    ("monitoring.coreos.com", "podmonitors"): CRUD,
    ("monitoring.coreos.com", "prometheusrules"): CRUD,
    ("autoscaling", "horizontalpodautoscalers"): CRUD,
    ("keda.sh", "scaledobjects"): CRUD,
    # patch: a pod removed by a scale-down leaves the pool first (its serving label).
    ("", "pods"): ("get", "list", "watch", "patch"),
    ("", "events"): ("create",),
    ("llm-d.ai", "inferenceobjectives"): ("get", "list", "watch"),
    ("llm-d.ai", "inferencemodelrewrites"): ("get", "list", "watch"),
    ("inference.networking.x-k8s.io", "inferenceobjectives"): ("get", "list", "watch"),
    ("inference.networking.x-k8s.io", "inferencemodelrewrites"): ("get", "list", "watch"),
}
# Cluster-scoped reads: Kopf's CRD scan and the PodMonitor CRD check; the planner's node list.
CRD_READS = {("apiextensions.k8s.io", "customresourcedefinitions"): ("get", "list", "watch"),
             ("", "nodes"): ("get", "list", "watch")}


def expand(table: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for (g, r), verbs in table.items() for v in verbs}


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


@pytest.fixture
def render(helm, tmp_path):
    def _render(values=None, **kw):
        return by_kind(documents(template_text(helm, tmp_path, values, **kw)))
    return _render


# ---------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("values", [
    {}, {"watchNamespace": "team-a"}, {"replicas": 2},
    {"watchNamespace": "team-a", "replicas": 2, "rbac.clusterScopedReads": False},
    {"metrics.serviceMonitor.enabled": True, "image.tag": "0.1.0-rc1"},
])
def test_helm_lint_is_clean(helm, tmp_path, values):
    from tests.helm.chart import set_args

    proc = run_helm(helm, tmp_path, "lint", "--strict", str(CHART), *set_args(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--set", "replicas=0"], "minimum"),
    (["--set-string", "replicas=two"], "want integer"),
    (["--set", "unknownKey=1"], "additional properties 'unknownKey' not allowed"),
    (["--set-string", "watchNamespace=Team_A"], "does not match pattern"),
    (["--set-string", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set-string", "resources.requests.memory=lots"], "/resources/requests/memory"),
    (["--set", "metrics.serviceMonitor.enabled=yes"], "want boolean"),
])
def test_values_schema_rejects_bad_values(helm, tmp_path, args, message):
    proc = run_helm(helm, tmp_path, "template", "x", str(CHART), *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_every_default_value_is_typed_by_the_schema():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node, sch, path):
        sch = schema["definitions"][sch["$ref"].split("/")[-1]] if "$ref" in sch else sch
        assert "type" in sch or "oneOf" in sch, f"{path} has no type in values.schema.json"
        if isinstance(node, dict) and "properties" in sch:
            assert sch.get("additionalProperties") is False, f"{path} allows unknown keys"
            for key, child in node.items():
                assert key in sch["properties"], f"{path}.{key} is not in values.schema.json"
                walk(child, sch["properties"][key], f"{path}.{key}")

    walk(values, schema, "values")


# ---------------------------------------------------------------- the Deployment


def test_operator_deployment_is_locked_down(render):
    objs = render()
    (dep,) = objs["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and sc["privileged"] is False
    assert c["image"] == "ghcr.io/longctx/longctx-operator:0.1.0"
    assert c["command"] == ["longctx"]
    assert c["args"] == ["operator", "--metrics-port=8080", "--health-port=8081"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 8080,
                                                                   "health": 8081}
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert pod["serviceAccountName"] == "longctx"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Nothing the chart makes may look like one of the operator's own children.
    for kind_objs in objs.values():
        for obj in kind_objs:
            assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_two_replicas_turn_on_peering(render):
    objs = render({"replicas": 2})
    (dep,) = objs["Deployment"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert dep["spec"]["replicas"] == 2
    assert "--peering=longctx" in c["args"]
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    (peering,) = objs["ClusterKopfPeering"]
    assert peering["apiVersion"] == "kopf.dev/v1" and peering["metadata"]["name"] == "longctx"
    (role,) = objs["ClusterRole"]
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in grants(role["rules"])

    objs = render({"replicas": 2, "watchNamespace": "team-a"})
    (peering,) = objs["KopfPeering"]
    assert peering["metadata"] == {**peering["metadata"], "name": "longctx",
                                   "namespace": "team-a"}
    (role,) = objs["Role"]
    assert ("kopf.dev", "kopfpeerings", "patch") in grants(role["rules"])

    objs = render()
    assert "ClusterKopfPeering" not in objs and "KopfPeering" not in objs
    (c,) = objs["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--peering") for a in c["args"])


def test_metrics_service_and_optional_service_monitor(render):
    objs = render()
    (svc,) = objs["Service"]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics",
                                     "protocol": "TCP"}]
    dep_labels = objs["Deployment"][0]["spec"]["template"]["metadata"]["labels"]
    assert all(dep_labels[k] == v for k, v in svc["spec"]["selector"].items())
    assert "ServiceMonitor" not in objs

    objs = render({"metrics.serviceMonitor.enabled": True,
                   "metrics.serviceMonitor.labels.release": "prom"})
    (sm,) = objs["ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert all(svc["metadata"]["labels"][k] == v
               for k, v in sm["spec"]["selector"]["matchLabels"].items())


# ---------------------------------------------------------------- RBAC, both modes


def test_cluster_wide_mode_grants_exactly_the_operators_verbs(render):
    objs = render()
    assert "Role" not in objs and "RoleBinding" not in objs
    (role,) = objs["ClusterRole"]
    (binding,) = objs["ClusterRoleBinding"]
    assert grants(role["rules"]) == expand(NAMESPACED) | expand(CRD_READS)
    assert binding["roleRef"] == {"apiGroup": RBAC, "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "longctx",
                                    "namespace": "longctx-system"}]
    (c,) = objs["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--namespace") for a in c["args"])


def test_namespaced_mode_grants_the_same_verbs_in_one_namespace(render):
    objs = render({"watchNamespace": "team-a"})
    (role,) = objs["Role"]
    (binding,) = objs["RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "team-a"
    assert grants(role["rules"]) == expand(NAMESPACED)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "longctx",
                                    "namespace": "longctx-system"}]
    # The only cluster-scoped grants: read-only CRD, node and namespace scans.
    (cluster_role,) = objs["ClusterRole"]
    assert grants(cluster_role["rules"]) == expand(CRD_READS) | {
        ("", "namespaces", "list"), ("", "namespaces", "watch")}
    (crb,) = objs["ClusterRoleBinding"]
    assert crb["roleRef"]["name"] == cluster_role["metadata"]["name"]
    (c,) = objs["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert "--namespace=team-a" in c["args"]

    objs = render({"watchNamespace": "team-a", "rbac.clusterScopedReads": False})
    assert "ClusterRole" not in objs and "ClusterRoleBinding" not in objs


def test_no_wildcards_and_no_escalation_verbs(render):
    for values in ({}, {"watchNamespace": "team-a"}, {"replicas": 2}):
        objs = render(values)
        for role in objs.get("ClusterRole", []) + objs.get("Role", []):
            for group, resource, verb in grants(role["rules"]):
                assert "*" not in (group, resource, verb), role["metadata"]["name"]
                assert verb not in ("escalate", "bind", "impersonate", "update",
                                    "deletecollection"), (resource, verb)
                assert resource not in ("secrets", "clusterroles",
                                        "clusterrolebindings"), resource
                assert resource != "nodes" or verb in ("get", "list", "watch"), (resource, verb)
                if verb in ("create", "patch", "delete"):  # writes: only what it owns
                    assert resource not in ("longcontextdeployments",
                                            "customresourcedefinitions", "namespaces"), resource
                    # Pods: only the label patch of a scale-down drain, never create/delete.
                    assert resource != "pods" or verb == "patch", (resource, verb)


def _operator_facts() -> dict:
    """What the operator code declares, read in a child process: importing the operator
    here would import the kubernetes client before the cluster fixture sets KUBECONFIG, and
    the client keeps the kubeconfig path it saw at import (Kopf's login then fails)."""
    import json
    import sys

    code = ("import json\n"
            "from longctx_operator.kinds import KINDS, MANAGED_KINDS, WATCHED_KINDS\n"
            "from longctx_operator.controller.builders.picker import picker_rules\n"
            "print(json.dumps({'picker_rules': picker_rules(),\n"
            "    'managed': [(k.api_version, k.kind) for k in MANAGED_KINDS],\n"
            "    'plurals': {k.kind: k.plural for k in KINDS},\n"
            "    'children': [(k.group, k.version, k.plural) for k in WATCHED_KINDS],\n"
            "    'cluster_reads': [(k.group, k.plural, k.access) for k in KINDS\n"
            "                      if k.cluster_scoped]}))\n")
    repo = CHART.parents[1]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(
        str(repo / p) for p in ("core", "engine", "operator", "kernels", "."))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_rbac_covers_what_the_operator_code_uses(render):
    """Ties the chart to the code: a new child kind without RBAC fails here."""
    facts = _operator_facts()
    picker_rules, MANAGED_KINDS = facts["picker_rules"], facts["managed"]
    PLURALS, CHILD_RESOURCES = facts["plurals"], facts["children"]

    granted = grants(render()["ClusterRole"][0]["rules"])
    for api_version, kind in MANAGED_KINDS:
        group = api_version.rpartition("/")[0]
        for verb in ("get", "list", "create", "patch", "delete"):  # apply, drift, clean-up
            assert (group, PLURALS[kind], verb) in granted, (kind, verb)
    for group, _version, plural in CHILD_RESOURCES:  # the watch caches
        for verb in ("list", "watch"):
            assert (group, plural, verb) in granted, (plural, verb)
    for group, plural, verbs in facts["cluster_reads"]:   # CRDs, Nodes
        for verb in verbs:
            assert (group, plural, verb) in granted, (plural, verb)
    # RBAC forbids granting what one does not hold: the picker Role the operator creates.
    assert grants(picker_rules) <= granted, grants(picker_rules) - granted


# ---------------------------------------------------------------- CRDs


def test_chart_rbac_rules_are_the_generator_output():
    from longctx_operator.rbac import RULES_FILE, render_rules_yaml

    committed = (CHART.parents[1] / RULES_FILE).read_text()
    assert committed == render_rules_yaml(), f"{RULES_FILE} is stale: run `make crds`"


def test_chart_crd_is_the_generator_output_and_equals_crds_dir():
    from longctx_operator.crd import CRD_FILE, render_crd_yaml

    generated = render_crd_yaml()
    chart_copy = (CHART / "crds" / CRD_FILE).read_text()
    repo_copy = (CHART.parents[1] / "crds" / CRD_FILE).read_text()
    assert chart_copy == generated, "charts/longctx/crds/ is stale: run `make crds`"
    assert repo_copy == generated, "crds/ is stale: run `make crds`"


def test_include_crds_carries_the_crd_and_kopf_peerings(helm, tmp_path):
    from longctx_operator.crd import render_crd_yaml

    docs = documents(template_text(helm, tmp_path, include_crds=True))
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert crds["longcontextdeployments.longctx.dev"] == yaml.safe_load(render_crd_yaml())
    for name, scope, kind in (("kopfpeerings.kopf.dev", "Namespaced", "KopfPeering"),
                              ("clusterkopfpeerings.kopf.dev", "Cluster", "ClusterKopfPeering")):
        crd = crds[name]
        assert crd["spec"]["scope"] == scope and crd["spec"]["names"]["kind"] == kind
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1" and version["served"] and version["storage"]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    # Without --include-crds, helm template leaves them out (they live in crds/, not templates/).
    docs = documents(template_text(helm, tmp_path))
    assert not any(d["kind"] == "CustomResourceDefinition" for d in docs)


# ---------------------------------------------------------------- kustomize


def test_kustomize_base_is_generated_from_the_chart(helm, tmp_path):
    out = tmp_path / "base"
    proc = subprocess.run(["bash", str(KUSTOMIZE_SCRIPT), str(out)], capture_output=True,
                          text=True, env={"HELM": str(helm), "PATH": "/usr/bin:/bin",
                                          "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    generated = sorted(p.relative_to(out) for p in out.rglob("*.yaml"))
    for rel in generated:
        assert filecmp.cmp(out / rel, KUSTOMIZE_BASE / rel, shallow=False), (
            f"charts/kustomize/base/{rel} is stale: run charts/kustomize/generate.sh")
    kustomization = yaml.safe_load((KUSTOMIZE_BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        ["namespace.yaml", *(str(r) for r in generated)])


def test_gitops_doc_examples_are_valid_yaml_pointing_at_this_chart():
    import re

    doc = (CHART.parents[1] / "docs" / "gitops.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    kinds = {}
    for block in blocks:
        for d in yaml.safe_load_all(block):
            if d:
                kinds.setdefault(d["kind"], []).append(d)
    assert {"Application", "HelmRelease", "GitRepository", "ConfigMap", "Kustomization"} <= set(
        kinds), kinds.keys()
    (release,) = kinds["HelmRelease"]
    assert release["spec"]["chart"]["spec"]["chart"] == "./charts/longctx"
    assert release["spec"]["upgrade"]["crds"] == "CreateReplace"
    apps = [a for a in kinds["Application"] if a["spec"]["source"].get("path") == "charts/longctx"]
    assert apps and "ServerSideApply=true" in apps[0]["spec"]["syncPolicy"]["syncOptions"]
    (cm,) = kinds["ConfigMap"]
    assert "resource.customizations.health.longctx.dev_LongContextDeployment" in cm["data"]
    assert (CHART / "files" / "argocd" / "health.lua").is_file()
