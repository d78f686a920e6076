"""RBAC sufficiency: the operator, as its own process, authenticated with a token of the
chart's ServiceAccount (not as an admin), takes examples/glm-5.3-1m.yaml to Ready in both
RBAC modes; and with one needed verb removed from the chart's Role it fails with an
HTTP 403 that names the permission.

The module-scoped in-process `operator` fixture is deliberately not used here: two
operators would fight over the same CRs.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.cluster import reconciles
from tests.cluster.operator_process import OperatorProcess
from tests.conftest import example_cr, revision_of, sts_name, wait_for
from tests.helm.chart import CHART

pytestmark = pytest.mark.cluster

RBAC_DENIAL = re.compile(r'cannot (get|list|watch|create|update|patch|delete) resource')


class ServiceAccountOperator(OperatorProcess):
    """`python -m longctx_operator.cli operator` with the ServiceAccount's kubeconfig,
    verbose, started once its /healthz answers."""

    def __init__(self, kubeconfig: Path, log_path: Path, args: list[str]):
        super().__init__(kubeconfig, log_path, args=("--verbose", *args),
                         env={"LONGCTX_WATCH_SERVER_TIMEOUT": "10"})

    def start(self) -> "ServiceAccountOperator":
        super().start()
        wait_for(self.healthy, 60, "the operator's /healthz")
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=5).read().decode()

    def stop(self, grace: float = 30) -> None:
        super().stop(grace)


def service_account_kubeconfig(cluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig with a TokenRequest token of the ServiceAccount and the admin
    kubeconfig's server and CA: what the pod would see, minus the pod."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration", "1h"
                            ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    assert base64.b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")
    user = f"system:serviceaccount:{namespace}:{sa}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": cluster.cp.server,
                                                   "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": user}}],
        "current-context": "sa"}))
    whoami = json.loads(cluster.kubectl("auth", "whoami", "-o", "json",
                                        kubeconfig=path).stdout)
    assert whoami["status"]["userInfo"]["username"] == user
    return path


def can_i(cluster, kubeconfig: Path, *args: str) -> bool:
    proc = cluster.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False)
    return proc.stdout.strip() == "yes"


def lcd_status(cluster, name: str, namespace: str) -> dict:
    return (cluster.get("lcd", name, namespace) or {}).get("status", {})


def is_ready(cluster, name: str, namespace: str) -> dict | None:
    status = lcd_status(cluster, name, namespace)
    conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return status if conds.get("Ready") == "True" else None


def delete_crs(cluster, namespace: str) -> None:
    """While the operator still runs: delete the CRs and wait until they are gone."""
    cluster.kubectl("delete", "lcd", "--all", "-n", namespace, "--wait=true", "--timeout=60s",
                    check=False)


@pytest.fixture
def release(cluster, namespace) -> Iterator[dict]:
    """A release of the chart; the test picks the values. Uninstalled afterwards."""
    made: dict = {}

    def install(*set_args: str) -> dict:
        name = f"rb-{uuid.uuid4().hex[:6]}"
        cluster.helm("install", name, str(CHART), "--namespace", namespace, *set_args,
                     "--wait", "--timeout", "120s")
        made.update(name=name, fullname=f"{name}-longctx", namespace=namespace)
        return made

    yield install
    if made:
        cluster.helm("uninstall", made["name"], "--namespace", namespace, "--wait",
                     "--timeout", "120s", check=False)


@pytest.mark.parametrize("mode, replicas", [
    ("cluster-wide", 1),  # the chart's defaults: standalone, ClusterRole
    ("cluster-wide", 2),  # Kopf peering on a ClusterKopfPeering
    ("namespaced", 1),
    ("namespaced", 2),    # Kopf peering on a KopfPeering in the watched namespace
])
def test_chart_rbac_is_enough_to_reach_ready(cluster, namespace, release, tmp_path, mode,
                                             replicas):
    values = ["--set", f"replicas={replicas}"]
    if mode == "namespaced":
        values += ["--set", f"watchNamespace={namespace}"]
    rel = release(*values)
    # The operator's arguments exactly as the chart's Deployment passes them.
    dep = cluster.get("deployment", rel["fullname"], namespace)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = [a for a in container["args"] if a.startswith(("--namespace=", "--peering="))]
    kubeconfig = service_account_kubeconfig(cluster, namespace, rel["fullname"],
                                            tmp_path / "sa.kubeconfig")
    # Least privilege, as the API server sees it.
    assert can_i(cluster, kubeconfig, "patch", "statefulsets.apps", "-n", namespace)
    assert can_i(cluster, kubeconfig, "patch", "longcontextdeployments.longctx.dev",
                 "--subresource=status", "-n", namespace)
    assert not can_i(cluster, kubeconfig, "patch", "longcontextdeployments.longctx.dev",
                     "-n", namespace)  # never the spec
    assert not can_i(cluster, kubeconfig, "get", "secrets", "-n", namespace)
    assert not can_i(cluster, kubeconfig, "create", "pods", "-n", namespace)
    assert not can_i(cluster, kubeconfig, "escalate", "roles.rbac.authorization.k8s.io",
                     "-n", namespace)
    assert not can_i(cluster, kubeconfig, "bind", "roles.rbac.authorization.k8s.io",
                     "-n", namespace)
    if mode == "namespaced":
        assert not can_i(cluster, kubeconfig, "list", "statefulsets.apps", "-n", "default")
        assert not can_i(cluster, kubeconfig, "list", "statefulsets.apps", "--all-namespaces")

    assert any(a.startswith("--peering=") for a in args) == (replicas > 1), args
    op = ServiceAccountOperator(kubeconfig, tmp_path / "operator.log", args).start()
    try:
        assert cluster.apply(example_cr("glm"), namespace).returncode == 0
        started = time.monotonic()

        def ready_or_explain():
            # Kopf pauses every watch when told a peering name but no peering mode: fail
            # fast with the cause instead of timing out.
            paused = "blockers: peering CRD is missing" in op.output()
            assert not (paused and time.monotonic() - started > 15 and not lcd_status(
                cluster, "glm", namespace)), (
                "the operator paused all its watches ('peering CRD is missing') and never "
                "reconciled: `longctx operator` without --peering passes peering_name "
                "'longctx' to kopf.run together with standalone=True, which makes peering "
                "mandatory with no peering resource (operator/longctx_operator/cli.py; pass "
                f"peering_name=args.peering). Log: {op.log}")
            return is_ready(cluster, "glm", namespace)

        status = wait_for(ready_or_explain, 180,
                          f"the CR's Ready condition (operator log: {op.log})", interval=1)
        assert status["phase"] == "Ready"
        assert status["prefill"]["readyReplicas"] == 1 and status["decode"]["readyReplicas"] == 1
        # Every child the operator makes, including the picker's Role and RoleBinding (which
        # it may only create because it holds every permission they grant).
        cr = example_cr()
        for kind, name in (("statefulset", sts_name(cr, "prefill")),
                           ("statefulset", sts_name(cr, "decode")),
                           ("configmap", f"glm-engine-{revision_of(cr)}"),
                           ("deployment", "glm-epp"),
                           ("role", "glm-epp"), ("rolebinding", "glm-epp"),
                           ("inferencepool", "glm"),
                           ("poddisruptionbudget", sts_name(cr, "decode"))):
            obj = cluster.get(kind, name, namespace)
            assert obj is not None, f"{kind}/{name} missing"
        assert "longctx" in op.metrics()
        if replicas > 1:  # the peering object carries this operator's key
            peering = (cluster.get("clusterkopfpeerings.kopf.dev", rel["fullname"])
                       if mode == "cluster-wide" else
                       cluster.get("kopfpeerings.kopf.dev", rel["fullname"], namespace))
            assert peering.get("status"), peering
        delete_crs(cluster, namespace)
    finally:
        op.stop()
    log = op.output()
    denials = [line for line in log.splitlines() if RBAC_DENIAL.search(line)
               and f"system:serviceaccount:{namespace}:" in line]
    assert not denials, "\n".join(denials[:10])
    assert "Not enough permissions" not in log, log[-3000:]


def without_verb(rules: list[dict], group: str, resource: str, verb: str) -> list[dict]:
    """The rules with one (group, resource, verb) removed, everything else kept."""
    out = []
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            others = [r for r in rule["resources"] if r != resource]
            if others:
                out.append({**rule, "resources": others})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                out.append({"apiGroups": [group], "resources": [resource], "verbs": verbs})
        else:
            out.append(rule)
    return out


@pytest.mark.parametrize("group, resource, verb", [
    ("apps", "statefulsets", "patch"),
    ("longctx.dev", "longcontextdeployments/status", "patch"),
])
def test_removing_one_verb_fails_with_a_clear_403(cluster, namespace, release, tmp_path,
                                                  group, resource, verb):
    # Two replicas (peering): independent of how standalone mode starts.
    rel = release("--set", f"watchNamespace={namespace}", "--set", "replicas=2")
    role = cluster.get("role", rel["fullname"], namespace)
    original = copy.deepcopy(role)
    role["rules"] = without_verb(role["rules"], group, resource, verb)
    for key in ("resourceVersion", "managedFields", "uid", "creationTimestamp"):
        role["metadata"].pop(key, None)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=rbac-test",
                    "-f", "-", input=json.dumps(role))
    kubeconfig = service_account_kubeconfig(cluster, namespace, rel["fullname"],
                                            tmp_path / "sa.kubeconfig")
    subresource = resource.partition("/")[2]
    plural = resource.partition("/")[0]
    can = ["patch", f"{plural}.{group}", "-n", namespace] + (
        [f"--subresource={subresource}"] if subresource else [])
    wait_for(lambda: not can_i(cluster, kubeconfig, *can), 30, f"{verb} {resource} revoked")

    op = ServiceAccountOperator(kubeconfig, tmp_path / "operator.log",
                                [f"--namespace={namespace}",
                                 f"--peering={rel['fullname']}"]).start()
    try:
        assert cluster.apply(example_cr("glm"), namespace).returncode == 0

        def failure_event():
            events = cluster.list("events", namespace)
            return [e for e in events if e["involvedObject"].get("name") == "glm"
                    and e.get("reason") == "ReconcileFailed"]

        (event, *_) = wait_for(failure_event, 60, "a ReconcileFailed event on the CR")
        message = event["message"]
        assert event["type"] == "Warning"
        assert "HTTP 403" in message, message
        assert f'cannot {verb} resource "{resource}" in API group "{group}"' in message, message
        assert "lacks this permission" in message, message  # the operator's hint
        # The same line in the operator's log, for whoever reads logs instead of events.
        wait_for(lambda: f'cannot {verb} resource \\"{resource}\\"' in op.output()
                 or f'cannot {verb} resource "{resource}"' in op.output(), 30,
                 "the 403 in the operator's log")
        # Never Ready while the verb is missing: not after the retry that follows either.
        def count() -> float:
            return reconciles.from_metrics(op.metrics())

        reconciles.wait_for_reconciles(count, count(), "the failure (its retry)", timeout=60)
        assert not is_ready(cluster, "glm", namespace)
        if resource == "statefulsets":
            assert cluster.get("statefulset", sts_name(example_cr(), "prefill"),
                               namespace) is None

        # Give the verb back (as the chart has it): the same operator now gets there.
        for key in ("resourceVersion", "managedFields", "uid", "creationTimestamp"):
            original["metadata"].pop(key, None)
        cluster.kubectl("apply", "--server-side", "--force-conflicts",
                        "--field-manager=rbac-test", "-f", "-", input=json.dumps(original))
        wait_for(lambda: can_i(cluster, kubeconfig, *can), 30, f"{verb} {resource} restored")
        # A failed event handler is not retried by Kopf: a new event (here an annotation
        # on the CR) triggers the next reconcile.
        cluster.kubectl("annotate", "lcd", "glm", "-n", namespace, "--overwrite",
                        f"test.longctx.dev/nudge={uuid.uuid4().hex[:6]}")
        wait_for(lambda: is_ready(cluster, "glm", namespace), 180,
                 f"Ready after the verb came back (operator log: {op.log})", interval=1)
        delete_crs(cluster, namespace)
    finally:
        op.stop()
