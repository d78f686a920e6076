"""GitOps on the real control plane: the Argo CD health check (health.lua, run by a real
Lua interpreter) against statuses the running operator wrote; server-side apply of the
example twice changes nothing; the operator never writes spec."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.cluster import reconciles
from tests.conftest import EXAMPLE, example_cr, sts_name, wait_for
from tests.test_argocd_health import argocd_health

pytestmark = pytest.mark.cluster


def ssa(cluster, cr: dict, namespace: str) -> dict:
    """`kubectl apply --server-side` as a GitOps tool does; returns the API's answer."""
    proc = cluster.kubectl("apply", "--server-side", "--field-manager=gitops", "-n", namespace,
                           "-o", "json", "-f", "-", input=yaml.safe_dump(cr), check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def get(cluster, name: str, namespace: str) -> dict:
    obj = cluster.get("lcd", name, namespace)
    assert obj is not None, f"lcd {namespace}/{name} is gone"
    return obj


def phase_is(cluster, name: str, namespace: str, *phases: str):
    def check():
        obj = get(cluster, name, namespace)
        status = obj.get("status", {})
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and status.get("phase") in phases else None
    return check


def health_of(obj: dict) -> dict:
    hs = argocd_health(obj)
    print(f"[argocd] {obj['metadata']['name']} gen {obj['metadata']['generation']} "
          f"phase {obj.get('status', {}).get('phase')}: {hs}")
    return hs


def test_health_follows_the_operator_from_apply_to_ready_to_crash_loop(cluster, operator,
                                                                     namespace):
    # Just applied: no status yet, or the status of a previous generation.
    created = ssa(cluster, example_cr("glm"), namespace)
    assert health_of(created)["status"] == "Progressing"

    ready = wait_for(phase_is(cluster, "glm", namespace, "Ready"), 180, "phase Ready")
    hs = health_of(ready)
    assert hs == {"status": "Healthy", "message": "AllReady: prefill, decode and router are "
                  "ready"}, hs

    # A spec change pushed from Git: the API's answer carries the new generation and the
    # old status, which Argo CD must not call Healthy.
    changed = ssa(cluster, example_cr("glm", prefill__replicas=2), namespace)
    assert changed["metadata"]["generation"] == ready["metadata"]["generation"] + 1
    hs = health_of(changed)
    assert hs["status"] == "Progressing" and "observe generation" in hs["message"], hs
    wait_for(phase_is(cluster, "glm", namespace, "Ready"), 180, "Ready at 2 prefill pods")

    # A crash loop (kwok runs no containers: the kubelet's report is written by hand).
    decode_pod = f"{sts_name(example_cr('glm', prefill__replicas=2), 'decode')}-0"
    pod = cluster.get("pod", decode_pod, namespace)
    container = pod["spec"]["containers"][0]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    crash = {"status": {"containerStatuses": [{
        "name": container["name"], "image": container["image"], "imageID": "",
        "ready": False, "started": False, "restartCount": 5,
        "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": "back-off 5m0s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                     "message": "RuntimeError: not enough /dev/shm for the "
                                                "CPU offload", "startedAt": now,
                                     "finishedAt": now}}}]}}
    cluster.kubectl("patch", "pod", decode_pod, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(crash))
    degraded = wait_for(phase_is(cluster, "glm", namespace, "Degraded"), 60, "phase Degraded")
    hs = health_of(degraded)
    assert hs["status"] == "Degraded", hs
    assert "CrashLoop" in hs["message"] and "not enough /dev/shm" in hs["message"], hs


def test_refused_spec_is_degraded_with_the_planners_reason(cluster, operator, namespace):
    ssa(cluster, example_cr("huge", maxContextTokens=16777216), namespace)
    refused = wait_for(phase_is(cluster, "huge", namespace, "Refused"), 60, "phase Refused")
    conds = {c["type"]: c for c in refused["status"]["conditions"]}
    assert conds["CapacityPlanned"]["status"] == "False"
    hs = health_of(refused)
    assert hs["status"] == "Degraded", hs
    assert hs["message"].startswith(conds["CapacityPlanned"]["reason"] + ": "), hs
    assert "16777216" in hs["message"], hs
    # Nothing was rolled out for the refused spec.
    assert not cluster.list("statefulsets", namespace, "app.kubernetes.io/instance=huge")


def test_too_few_gpus_is_progressing(cluster, operator, namespace):
    # 6 prefill pods of 8 GPUs on 4 simulated 8-GPU nodes: some pods cannot be scheduled.
    ssa(cluster, example_cr("wide", prefill__replicas=6), namespace)

    def unschedulable():
        obj = get(cluster, "wide", namespace)
        conds = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
        return obj if conds.get("PrefillReady", {}).get("reason") == "Unschedulable" else None

    obj = wait_for(unschedulable, 120, "PrefillReady=False, reason Unschedulable")
    assert obj["status"]["phase"] == "Progressing"
    hs = health_of(obj)
    assert hs["status"] == "Progressing", hs
    assert "cannot be scheduled" in hs["message"], hs


def _settled(cluster, name: str, namespace: str, quiet: float = 4.0) -> dict:
    """The CR once its resourceVersion has not moved for `quiet` seconds."""
    last = get(cluster, name, namespace)
    still_since = time.monotonic()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        time.sleep(0.5)
        obj = get(cluster, name, namespace)
        if obj["metadata"]["resourceVersion"] != last["metadata"]["resourceVersion"]:
            last, still_since = obj, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return obj
    raise AssertionError(f"lcd {name} kept changing: {last['metadata']['resourceVersion']}")


def test_server_side_apply_twice_is_a_no_op_and_the_operator_never_writes_spec(
        cluster, operator, namespace):
    cr = yaml.safe_load(EXAMPLE.read_text())
    first = ssa(cluster, cr, namespace)
    wait_for(phase_is(cluster, "glm", namespace, "Ready"), 180, "phase Ready")
    before = _settled(cluster, "glm", namespace)

    # The same file again, the way Argo CD / Flux re-sync.
    second = ssa(cluster, cr, namespace)
    assert second["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert second["metadata"]["generation"] == before["metadata"]["generation"] == \
        first["metadata"]["generation"] == 1
    diff = cluster.kubectl("diff", "--server-side", "--field-manager=gitops", "-n", namespace,
                           "-f", str(EXAMPLE), check=False)
    assert diff.returncode == 0 and not diff.stdout, diff.stdout  # no drift
    # The re-apply changed nothing, so no watch event followed it: a child's event (an
    # annotation no one owns) makes the operator reconcile the re-applied CR, which it
    # must do without a write.
    done = reconciles.in_process()
    cluster.kubectl("annotate", "statefulset", sts_name(cr, "decode"), "-n", namespace,
                    "test.longctx.dev/nudge=1", "--overwrite")
    reconciles.wait_for_reconciles(reconciles.in_process, done, "a child's event")
    after = json.loads(cluster.kubectl("get", "lcd", "glm", "-n", namespace, "-o", "json",
                                       "--show-managed-fields").stdout)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # Who owns what: only the applier owns spec; the operator touches status only, through
    # the status subresource; no finalizers or Kopf annotations on the CR.
    spec_owners, others = set(), []
    for entry in after["metadata"]["managedFields"]:
        fields = entry.get("fieldsV1", {})
        if "f:spec" in fields:
            spec_owners.add((entry["manager"], entry["operation"]))
        if entry["manager"] != "gitops":
            others.append(entry)
    assert spec_owners == {("gitops", "Apply")}, after["metadata"]["managedFields"]
    assert others, "the operator's status writes should be recorded in managedFields"
    for entry in others:
        assert entry.get("subresource") == "status", entry
        assert set(entry["fieldsV1"]) <= {"f:status"}, entry
    assert not after["metadata"].get("finalizers")
    assert not any(k.startswith("kopf.") for k in after["metadata"].get("annotations", {}))
    assert after["spec"] == second["spec"]
