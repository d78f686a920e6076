"""An operator upgrade that renders a CR differently rolls the change out like any in-place
edit: one pod at a time per role, Ready prefill and decode never at zero, and the CR's
status and events say that the operator, not the spec, caused it."""

from __future__ import annotations

import json
import threading

import pytest
from kopf.testing import KopfRunner

from longctx_core import contract
from longctx_core.plan import faults, roles
from longctx_core.api.spec import load_spec
from longctx_core.vllm_config.recipes import launch_document
from longctx_core.plan.roles import serving_plan
from tests.cluster.real_engines import EXAMPLE
from tests.conftest import kopf_settings, wait_for

pytestmark = pytest.mark.cluster
ARGS = ["run", "--all-namespaces", "--standalone", "-m", "longctx_operator.runtime.main"]
NAME = "upgrade"


def cpu_cr_on_kwok() -> dict:
    """The CPU example with two pods per role, simulated by kwok (nothing needs to run)."""
    import yaml
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["metadata"]["name"] = NAME
    cr["spec"]["model"]["source"]["pvc"] = {"claimName": "models", "subPath": "mla"}
    cr["spec"]["prefill"]["replicas"] = 2
    cr["spec"]["decode"]["replicas"] = 2
    return cr


def ready_pods(cluster, namespace: str) -> dict[str, int]:
    out = dict.fromkeys(contract.ROLES, 0)
    for pod in cluster.list("pods", namespace, f"app.kubernetes.io/instance={NAME}"):
        role = pod["metadata"]["labels"].get(contract.COMPONENT_LABEL)
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (pod.get("status") or {}).get("conditions", []))
        if role in out and ready and not pod["metadata"].get("deletionTimestamp"):
            out[role] += 1
    return out


def engine_pods(cluster, namespace: str) -> list[dict]:
    return [p for p in cluster.list("pods", namespace, f"app.kubernetes.io/instance={NAME}")
            if p["metadata"]["labels"].get(contract.COMPONENT_LABEL) in contract.ROLES]


def rolled_to(cluster, namespace: str, digests: dict[str, str]) -> bool:
    for role, digest in digests.items():
        stss = cluster.list("statefulsets", namespace,
                            f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component={role}")
        if len(stss) != 1:
            return False
        sts = stss[0]
        template = sts["spec"]["template"]["metadata"]["annotations"]
        st = sts.get("status") or {}
        # The controller has seen this template (else both revisions are still the old one).
        if template.get(contract.ENGINE_CONFIG_ANNOTATION) != digest or \
                st.get("observedGeneration") != sts["metadata"]["generation"] or \
                st.get("updateRevision") != st.get("currentRevision") or \
                st.get("updatedReplicas", 0) != sts["spec"]["replicas"] or \
                st.get("readyReplicas", 0) != sts["spec"]["replicas"]:
            return False
    return True


def digests(cr: dict, namespace: str) -> dict[str, str]:
    from longctx_operator.controller.builders.engine import config_digest
    cr = {**cr, "metadata": {**cr["metadata"], "namespace": namespace}}
    return {r.role: config_digest(cr, r) for r in serving_plan(load_spec(cr["spec"])).roles}


def test_a_new_rendering_rolls_in_place_and_status_names_the_operator(cluster, namespace,
                                                                      monkeypatch):
    cr = cpu_cr_on_kwok()
    with KopfRunner(ARGS, settings=kopf_settings(), timeout=60):
        assert cluster.apply(cr, namespace).returncode == 0
        wait_for(lambda: rolled_to(cluster, namespace, digests(cr, namespace)), 120,
                 "the first rendering")
    before = digests(cr, namespace)
    uids = {p["metadata"]["uid"] for p in engine_pods(cluster, namespace)}

    # The next operator build: a recalibrated fault setting (the NIXL lease) changes what it
    # renders for the same spec.
    monkeypatch.setattr(faults, "VLLM_DEFAULT_LEASE_SECONDS", faults.VLLM_DEFAULT_LEASE_SECONDS + 15)
    roles._priced.cache_clear()
    after = digests(cr, namespace)
    assert after["prefill"] != before["prefill"] and after["decode"] != before["decode"]
    lease = faults.VLLM_DEFAULT_LEASE_SECONDS

    seen: list[dict[str, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(ready_pods(cluster, namespace))
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        with KopfRunner(ARGS, settings=kopf_settings(), timeout=60):
            watcher.start()
            wait_for(lambda: rolled_to(cluster, namespace, after), 180, "the new rendering")
            status = cluster.get("lcd", NAME, namespace)["status"]
    finally:
        stop.set()
        roles._priced.cache_clear()
    watcher.join(timeout=5)

    assert seen and min(s["prefill"] for s in seen) >= 1 and min(s["decode"] for s in seen) >= 1, seen
    # Every pod was replaced (a kwok pod is Ready again too soon for sampling to see it).
    pods = engine_pods(cluster, namespace)
    assert len(pods) == 4 and not uids & {p["metadata"]["uid"] for p in pods}, "not restarted"
    cause = status["rolloutCause"]
    assert cause["cause"] == "operator" and sorted(cause["roles"]) == ["decode", "prefill"], cause
    assert "spec did not change" in cause["message"]
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    assert "OperatorRender" in {e["reason"] for e in events["items"]}
    configmap = cluster.list("configmaps", namespace, f"app.kubernetes.io/instance={NAME},"
                             f"app.kubernetes.io/component=engine")[0]
    document = json.loads(configmap["data"][contract.launch_key("decode")])
    assert f'"kv_lease_duration":{lease}' in " ".join(document["argv"])
    plan = serving_plan(load_spec(cr["spec"]))
    assert configmap["data"][contract.launch_key("decode")] == \
        launch_document(plan.decode, NAME, namespace).to_json()
    cluster.kubectl("delete", "lcd", NAME, "-n", namespace, "--wait=false", check=False)
