"""What a rollout costs, per strategy and size, on the local control plane (a script).

For Surge and Recreate with 1 and 2 replicas per role, an image upgrade of the example
(between the two simulated images whose pods load for --load-seconds) is sampled every
200 ms: the pods the InferencePool selects and how many of them are Ready. Prints routable
capacity over time as a text chart, then zero-capacity seconds, time to switch, time to
drain and GPUs held at peak, beside what each strategy promises.

    PYTHONPATH=core:operator:. python benchmarks/rollout.py [--load-seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "core"), str(REPO / "operator")]

from tests.cluster.controlplane import ControlPlane  # noqa: E402
from tests.cluster.manifests import model_volume  # noqa: E402
from tests.cluster.operator_process import OperatorProcess  # noqa: E402
from tests.cluster.kwok_stages import LOAD_IMAGE, LOAD_IMAGE_2  # noqa: E402
from tests.cluster.sampling import SAMPLE_SECONDS, PoolSampler  # noqa: E402

DRAIN_SECONDS = 5
CASES = [("Surge", 1), ("Surge", 2), ("Recreate", 1), ("Recreate", 2)]


def manifest(name: str, image: str, strategy: str, replicas: int) -> dict:
    cr = yaml.safe_load((REPO / "examples" / "glm-5.3-1m.yaml").read_text())
    cr["metadata"] = {"name": name}
    spec = cr["spec"]
    spec.setdefault("engine", {})["image"] = image
    spec["prefill"]["replicas"] = spec["decode"]["replicas"] = replicas
    spec["rollout"] = {"strategy": strategy, "drainSeconds": DRAIN_SECONDS}
    return cr


def revision(cp: ControlPlane, namespace: str, name: str) -> tuple[str, str]:
    st = json.loads(cp.kubectl("get", "lcd", name, "-n", namespace, "-o", "json").stdout).get(
        "status", {})
    return st.get("revision", ""), (st.get("rollout") or {}).get("phase", "")


def settled(cp: ControlPlane, namespace: str, name: str, rev: str | None) -> bool:
    st = json.loads(cp.kubectl("get", "lcd", name, "-n", namespace, "-o", "json").stdout).get(
        "status", {})
    sets = json.loads(cp.kubectl("get", "statefulsets", "-n", namespace, "-o", "json").stdout)
    revisions = {s["metadata"]["labels"]["longctx.dev/pairing"] for s in sets["items"]}
    return (st.get("phase") == "Ready" and (st.get("rollout") or {}).get("phase") == "Steady"
            and (rev is None or st.get("revision") == rev) and len(revisions) == 1)


def wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def run_case(cp: ControlPlane, strategy: str, replicas: int, load: float) -> dict:
    namespace = f"rollout-{strategy.lower()}-{replicas}"
    name = "glm"
    cp.kubectl("create", "namespace", namespace)
    cp.kubectl("apply", "-f", "-", input=model_volume(namespace))
    old = manifest(name, LOAD_IMAGE, strategy, replicas)
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(old))
    wait(lambda: settled(cp, namespace, name, None), 180, f"{namespace} first revision")
    old_rev, _ = revision(cp, namespace, name)
    sampler = PoolSampler(namespace, name)
    sampler.start()
    edited = time.monotonic()
    cp.kubectl("apply", "-n", namespace, "-f", "-",
               input=yaml.safe_dump(manifest(name, LOAD_IMAGE_2, strategy, replicas)))
    wait(lambda: (r := revision(cp, namespace, name))[0] not in ("", old_rev)
         and settled(cp, namespace, name, r[0]), 300, f"{namespace} rollout")
    new_rev, _ = revision(cp, namespace, name)
    old_prefix = f"{name}-prefill-{old_rev}"
    switch = sampler.until(lambda s: s.selected == new_rev, 30, "the switch").t - edited
    gone = sampler.until(lambda s: not any(p.startswith(old_prefix) for p in s.pods), 60,
                         "the old pods deleted").t - edited
    sampler.stop.set()
    sampler.join()
    samples = sampler.samples
    zero = sum(SAMPLE_SECONDS for s in samples
               if not (s.ready["prefill"] and s.ready["decode"]))
    chart = []
    for second in range(int(samples[-1].t - edited) + 1):
        bucket = [s for s in samples if second <= s.t - edited < second + 1]
        if bucket:
            s = min(bucket, key=lambda s: len(s.ready["prefill"]) + len(s.ready["decode"]))
            tag = "old" if s.selected == old_rev else "new" if s.selected == new_rev else "-"
            chart.append(f"  +{second:3d}s {tag:>3} prefill {'#' * len(s.ready['prefill']):<2}"
                         f" decode {'#' * len(s.ready['decode']):<2} GPUs {s.gpus}")
    cp.kubectl("delete", "namespace", namespace, "--wait=false")
    return {"strategy": strategy, "replicas": replicas, "zero": zero, "switch": switch,
            "drain": gone - switch, "removed_old_pods": gone,
            "peak_gpus": max(s.gpus for s in samples), "chart": chart,
            "gpus_one_revision": replicas * 16}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load-seconds", type=float, default=10.0,
                        help="simulated model load of each new engine pod")
    args = parser.parse_args()
    cp = ControlPlane(nodes=8, load_seconds=args.load_seconds).start()
    operator = None
    try:
        for f in [REPO / "crds" / "longctx.dev_longcontextdeployments.yaml",
                  *sorted((cp.share_dir / "crds").glob("*.yaml"))]:
            cp.kubectl("apply", "--server-side", "-f", str(f))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        os.environ["KUBECONFIG"] = str(cp.kubeconfig)
        operator = OperatorProcess(cp.kubeconfig, cp.workdir / "operator.log").start()
        time.sleep(5)
        results = [run_case(cp, s, r, args.load_seconds) for s, r in CASES]
    finally:
        if operator:
            operator.stop(grace=30)
        cp.stop()
    print(f"image upgrade of the example; simulated model load {args.load_seconds:.0f} s, "
          f"drain window {DRAIN_SECONDS} s, sampled every {SAMPLE_SECONDS * 1000:.0f} ms\n")
    for r in results:
        print(f"{r['strategy']}, {r['replicas']} replica(s) per role: routable Ready pods "
              "(fewest in each second) and the revision the pool selects")
        print("\n".join(r["chart"]) + "\n")
    header = ("strategy", "replicas/role", "zero-capacity s", "switch s", "drain s",
              "GPUs at peak", "promise")
    rows = [(r["strategy"], str(r["replicas"]), f"{r['zero']:.1f}", f"{r['switch']:.1f}",
             f"{r['drain']:.1f}", f"{r['peak_gpus']} ({r['peak_gpus'] / r['gpus_one_revision']:.0f}x one revision)",
             "0 s zero capacity, 2x GPUs" if r["strategy"] == "Surge" else
             f"zero capacity ~ one load ({args.load_seconds:.0f} s), 1x GPUs")
            for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
