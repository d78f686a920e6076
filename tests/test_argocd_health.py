"""The Argo CD health check (charts/longctx/files/argocd/health.lua), executed by a real Lua
interpreter (lupa's Lua 5.1, the dialect of Argo CD's gopher-lua) against status objects.

Here the statuses come from the operator's own pure status function; tests/cluster/
test_gitops.py feeds the same script the statuses the running operator wrote on the
local control plane.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
HEALTH_LUA = REPO / "charts" / "longctx" / "files" / "argocd" / "health.lua"
ARGOCD_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def _to_lua(lua: Any, value: Any) -> Any:
    """Like Argo CD: the object goes through JSON, so every number is a float64."""
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"not JSON: {value!r}")


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Runs health.lua the way Argo CD does: `obj` is a global, the script returns hs."""
    from lupa import lua51

    lua = lua51.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    obj = json.loads(json.dumps(obj))  # only what survives JSON, as in Argo CD
    lua.globals().obj = _to_lua(lua, obj)
    hs = lua.execute(HEALTH_LUA.read_text())
    assert hs is not None, "health.lua returned nothing"
    result = {k: hs[k] for k in ("status", "message") if hs[k] is not None}
    assert result.get("status") in ARGOCD_STATUSES, result
    assert isinstance(result.get("message"), str) and result["message"], result
    return result


# ---------------------------------------------------------------- statuses from the operator


def _sts(ready=1, updated=1, generation=1, observed=1):
    return {"metadata": {"generation": generation}, "spec": {"replicas": 1},
            "status": {"readyReplicas": ready, "updatedReplicas": updated,
                       "observedGeneration": observed}}


def _cr(status: dict | None, generation: int = 2) -> dict:
    cr = {"apiVersion": "longctx.dev/v1alpha1", "kind": "LongContextDeployment",
          "metadata": {"name": "glm", "namespace": "ns", "generation": generation},
          "spec": {"maxContextTokens": 1048576}}
    if status is not None:
        cr["status"] = status
    return cr


def operator_status(statefulsets, pods=(), router=(True, "Available", "ok"), refusal=None,
                    generation=2) -> dict:
    from longctx_operator.controller.status import Observed, compute_status

    return compute_status(_cr(None, generation), refusal=refusal, plan={"fits": refusal is None},
                          observed=Observed(statefulsets=statefulsets, pods=list(pods),
                                            router=router),
                          desired_replicas={"prefill": 1, "decode": 1}, endpoint="x",
                          previous=None)


def _crashing_pod(role="decode"):
    return {"metadata": {"name": f"glm-{role}-0",
                         "labels": {"app.kubernetes.io/component": role}},
            "status": {"containerStatuses": [{
                "name": "engine", "restartCount": 5,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 1,
                                             "message": "/dev/shm too small"}}}]}}


def test_ready_is_healthy():
    hs = argocd_health(_cr(operator_status({"prefill": _sts(), "decode": _sts()})))
    assert hs["status"] == "Healthy", hs
    assert "AllReady" in hs["message"]


def test_pods_not_ready_is_progressing_with_the_waiting_condition():
    hs = argocd_health(_cr(operator_status({"prefill": _sts(ready=0), "decode": _sts()})))
    assert hs["status"] == "Progressing", hs
    assert "PrefillReady" in hs["message"] and "0/1" in hs["message"]


def test_children_not_created_yet_is_progressing():
    hs = argocd_health(_cr(operator_status({"prefill": None, "decode": None})))
    assert hs["status"] == "Progressing", hs


def test_router_not_ready_is_progressing():
    status = operator_status({"prefill": _sts(), "decode": _sts()},
                             router=(False, "PickerNotReady", "0/1 picker pods ready"))
    hs = argocd_health(_cr(status))
    assert hs["status"] == "Progressing", hs
    assert "RouterReady" in hs["message"]


def test_crash_loop_is_degraded_with_the_exit_message():
    status = operator_status({"prefill": _sts(), "decode": _sts(ready=0)},
                             pods=[_crashing_pod()])
    hs = argocd_health(_cr(status))
    assert hs["status"] == "Degraded", hs
    assert "CrashLoop" in hs["message"] and "/dev/shm too small" in hs["message"]


def test_capacity_refusal_is_degraded_even_while_old_children_are_ready():
    from longctx_operator.controller.status import Refusal

    refusal = Refusal("CapacityPlanned", "InsufficientKVCapacity",
                      "spec.maxContextTokens 16777216 does not fit: 107 GiB KV per GPU > 88 GiB")
    status = operator_status({"prefill": _sts(), "decode": _sts()}, refusal=refusal)
    assert status["phase"] == "Refused"
    hs = argocd_health(_cr(status))
    assert hs["status"] == "Degraded", hs
    assert hs["message"].startswith("InsufficientKVCapacity: spec.maxContextTokens 16777216")


def test_invalid_spec_is_degraded():
    from longctx_operator.controller.status import Refusal

    refusal = Refusal("Accepted", "InvalidSpec", "prefill and decode engines are incompatible")
    hs = argocd_health(_cr(operator_status({"prefill": None, "decode": None}, refusal=refusal)))
    assert hs["status"] == "Degraded", hs
    assert hs["message"].startswith("InvalidSpec: ")


def test_no_status_yet_is_progressing():
    hs = argocd_health(_cr(None))
    assert hs["status"] == "Progressing", hs


@pytest.mark.parametrize("observed", [None, 1])
def test_status_of_an_older_generation_is_progressing_even_if_it_said_ready(observed):
    status = operator_status({"prefill": _sts(), "decode": _sts()}, generation=1)
    if observed is None:
        del status["observedGeneration"]
    hs = argocd_health(_cr(status, generation=2))
    assert hs["status"] == "Progressing", hs
    assert "generation 2" in hs["message"]


def test_older_generation_wins_over_an_old_refusal():
    """A fix pushed after a refusal shows Progressing until the operator has looked at it."""
    from longctx_operator.controller.status import Refusal

    refusal = Refusal("CapacityPlanned", "InsufficientKVCapacity", "too long")
    status = operator_status({"prefill": _sts(), "decode": _sts()}, refusal=refusal, generation=3)
    assert argocd_health(_cr(status, generation=3))["status"] == "Degraded"
    assert argocd_health(_cr(status, generation=4))["status"] == "Progressing"


def test_minimal_hand_written_statuses():
    """Shapes not produced by this operator version still map sensibly (no Lua errors)."""
    cases = [
        ({"observedGeneration": 2, "phase": "Ready",
          "conditions": [{"type": "Ready", "status": "True"}]}, "Healthy"),
        ({"observedGeneration": 2, "conditions": []}, "Progressing"),
        ({"observedGeneration": 2, "phase": "Refused"}, "Degraded"),
        ({"observedGeneration": 2, "phase": "Degraded"}, "Degraded"),
        ({"observedGeneration": 2, "conditions": [{"type": "Progressing", "status": "True",
                                                    "reason": "RollingOut"}]}, "Progressing"),
        ({}, "Progressing"),
    ]
    for status, expected in cases:
        assert argocd_health(_cr(copy.deepcopy(status)))["status"] == expected, status


def test_script_stays_within_lua_5_1():
    """gopher-lua (Argo CD) is Lua 5.1: no goto, integer division or bitwise operators."""
    code = "\n".join(line.split("--", 1)[0] for line in HEALTH_LUA.read_text().splitlines())
    for pattern in (r"\bgoto\b", r"//", r"<<", r">>", r"&", r"~(?!=)", r"\|"):
        assert not re.search(pattern, code), pattern
