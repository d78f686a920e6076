"""`make demo`: the main job end to end on the local control plane.

Starts the control plane (simulated H200 nodes), installs the CRDs, runs the operator as
its own process, applies examples/glm-5.3-1m.yaml, waits for Ready, prints what was
created and the CR's status, then tears everything down.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.controlplane import REPO, ControlPlane, model_volume
from tests.cluster.operator_process import OperatorProcess

EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"
NAMESPACE = "longctx-demo"


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def main() -> int:
    started = time.monotonic()
    step("starting the local control plane (etcd, kube-apiserver, controller-manager, "
         "scheduler, kwok with 4 simulated 8x H200 nodes)")
    cp = ControlPlane().start()
    operator = None
    try:
        print(f"    kube-apiserver {cp.version()} at {cp.server}")
        step("installing the LongContextDeployment CRD and the InferencePool/Gateway API CRDs")
        for f in [REPO / "crds" / "longctx.dev_longcontextdeployments.yaml",
                  *sorted((cp.share_dir / "crds").glob("*.yaml"))]:
            cp.kubectl("apply", "--server-side", "-f", str(f))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")

        step("starting the operator (longctx operator)")
        operator = OperatorProcess(cp.kubeconfig, cp.workdir / "operator.log").start()

        step(f"capacity plan of {EXAMPLE.relative_to(REPO)} (offline: longctx plan)")
        subprocess.run([sys.executable, "-m", "longctx_operator.cli", "plan", "-f", str(EXAMPLE)],
                       check=False)

        step(f"kubectl apply -f {EXAMPLE.relative_to(REPO)} -n {NAMESPACE}")
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("apply", "-f", "-", input=model_volume(NAMESPACE))  # the weights' PVC
        print(cp.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLE)).stdout.strip())

        step("waiting for Ready (pods scheduled onto simulated H200 nodes, kwok runs them)")
        deadline = time.monotonic() + 180
        last = ""
        while True:
            out = cp.kubectl("get", "lcd", "glm", "-n", NAMESPACE, "-o", "json", check=False)
            status = json.loads(out.stdout).get("status", {}) if out.returncode == 0 else {}
            conds = {c["type"]: c for c in status.get("conditions", [])}
            prefill = status.get("prefill", {}).get("summary", "-")
            decode = status.get("decode", {}).get("summary", "-")
            router = conds.get("RouterReady", {}).get("status", "-")
            line = (f"    phase={status.get('phase', '-')} prefill={prefill} decode={decode} "
                    f"router={router}")
            if line != last:
                print(line, flush=True)
                last = line
            if conds.get("Ready", {}).get("status") == "True":
                break
            if not operator.alive or time.monotonic() > deadline:
                print(operator.log.read_text()[-4000:])
                raise SystemExit("the CR did not become Ready; the operator log is above")
            time.sleep(1)

        step("kubectl get lcd")
        print(cp.kubectl("get", "lcd", "-n", NAMESPACE).stdout)
        step("what the operator created")
        print(cp.kubectl("get", "statefulsets,services,configmaps,deployments,"
                         "poddisruptionbudgets,inferencepools,serviceaccounts,roles,rolebindings",
                         "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=glm").stdout)
        print(cp.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout)
        step("the CR's status")
        status = json.loads(cp.kubectl("get", "lcd", "glm", "-n", NAMESPACE, "-o",
                                       "json").stdout)["status"]
        for cond in status["conditions"]:
            print(f"    {cond['type']:<16} {cond['status']:<6} {cond['reason']:<22} "
                  f"{cond['message']}")
        plan = status.get("plan", {})
        if plan:
            print(f"    plan: {json.dumps(plan)[:600]}")
        print(f"    endpoint: {status.get('endpoint')}")

        step("deleting the CR (children are garbage-collected)")
        cp.kubectl("delete", "lcd", "glm", "-n", NAMESPACE)
        print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
        return 0
    finally:
        step("tearing down")
        if operator:
            operator.stop()
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
