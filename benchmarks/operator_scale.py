"""Operator scale benchmark on the local control plane (a script, not a test).

Creates N LongContextDeployments (default 100) against a real kube-apiserver with the
operator running as its own process, and records (tests/figures.py: `make figures` puts the
run into docs/benchmarks.md's table) and prints: time until every child exists (from the
children's creationTimestamps, read once at the end: a watch of every child kind would load
the API server being measured),
create-to-Ready latency p50/p99, reconcile duration p50/p99 (the operator's histogram),
API writes per CR at creation and at steady state, the operator's resident memory, each
process's CPU and their sum over the machine's cores (the shortest the burst could last there),
the operator's CPU per CR, and the API server's busiest requests per CR (every client's, by
resource and verb).

    PYTHONPATH=core:operator:. python benchmarks/operator_scale.py [--crs 100]

It exits 1 when a run misses a goal (`missed`): at any size, a child not created, a CR not
Ready or a write at steady state; at the goals' size (tests/figure_tables.py), the operator's
CPU per CR or the reconcile p99 over its goal.

CRs use replicas 0 for both roles so that N CRs do not need 16·N simulated GPUs: every
child object is still created and watched; only the pods are absent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "core"), str(REPO / "operator")]

from longctx_core import contract  # noqa: E402
from longctx_operator.runtime.kube import Kube, KubeError, collection_path  # noqa: E402
from longctx_operator import kinds  # noqa: E402
from tests.cluster.controlplane import ControlPlane  # noqa: E402
from tests.cluster.operator_process import OperatorProcess  # noqa: E402
from tests.figure_tables import (GOAL_CPU_PER_CR_S, GOAL_CRS, GOAL_RECONCILE_P99_S,  # noqa: E402
                                 operator_scale)
from tests.figures import Figures  # noqa: E402

NAMESPACE = "scale"
RECONCILE = "longctx_reconcile_duration_seconds"
QUEUED = "longctx_reconcile_queue_seconds"
CREATORS = 4
STARTUP_SECONDS = 120
REQUEST_ROWS = 16  # the API server's busiest (resource, verb) pairs in the table


class ReadyWatch:
    """Watches (not polls) the CRs and records when each first reports Ready=True. The
    children are not watched: a watch of each child kind would add a serialization of every
    child event to the API server being measured; when they were created is read once, at
    the end, from their creationTimestamp."""

    def __init__(self, kubeconfig: Path):
        os.environ["KUBECONFIG"] = str(kubeconfig)
        self.kube = Kube.from_environment()
        self.ready_at: dict[str, float] = {}
        self._stopping = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def _watch(self) -> None:
        try:
            self._follow()
        except (KubeError, urllib3.exceptions.HTTPError, OSError):
            if not self._stopping.is_set():   # the control plane stopping ends it otherwise
                raise

    def _follow(self) -> None:
        kind = kinds.KIND_BY_NAME[contract.KIND]
        version = self.kube.list_raw(kind, NAMESPACE, "")["metadata"]["resourceVersion"]
        while not self._stopping.is_set():
            query = [("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", "60")]
            with self.kube.stream(collection_path(kind, NAMESPACE), query, 90) as response:
                for line in response:
                    if self._stopping.is_set():
                        return
                    event = json.loads(line) if line.strip() else {}
                    obj = event.get("object") or {}
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    name = obj.get("metadata", {}).get("name")
                    if event.get("type") not in ("ADDED", "MODIFIED") or not name:
                        continue
                    if any(c["type"] == "Ready" and c["status"] == "True"
                           for c in (obj.get("status") or {}).get("conditions", [])):
                        self.ready_at.setdefault(name, time.monotonic())


def children_created(kube: Kube, child_kinds: set[str]) -> tuple[int, float]:
    """How many children exist, and the wall-clock time by which the last was created.
    creationTimestamp has whole seconds, so the time is rounded up to the next second."""
    count, last = 0, 0.0
    for kind in sorted(child_kinds):
        k = kinds.KIND_BY_NAME[kind]
        for item in kube.list_raw(k, NAMESPACE, k.label_selector)["items"]:
            stamp = datetime.strptime(item["metadata"]["creationTimestamp"],
                                      "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
            count, last = count + 1, max(last, stamp.timestamp() + 1)
    return count, last


def create_all(crs: list[dict]) -> None:
    """Creates the CRs over a few connections at once (kubectl applies one at a time, and
    every create is validated against the CRD's rules, so one stream cannot keep up)."""
    api = kubernetes.client.CustomObjectsApi()
    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(lambda cr: api.create_namespaced_custom_object(
            contract.GROUP, contract.VERSION, NAMESPACE, contract.PLURAL, cr), crs))


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("longctx_") and " " in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def writes(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("longctx_api_writes_total{"))


def buckets(metrics: dict[str, float], histogram: str) -> list[tuple[float, float]]:
    """A histogram's cumulative (upper bound, count) pairs."""
    return sorted((float(k.split('le="')[1].split('"')[0]) if 'le="+Inf"' not in k
                   else float("inf"), v) for k, v in metrics.items()
                  if k.startswith(f"{histogram}_bucket"))


def histogram_quantile(metrics: dict[str, float], histogram: str, q: float) -> float | None:
    """The upper bound of the bucket holding quantile q; None beyond the last bound."""
    cumulative = buckets(metrics, histogram)
    total = cumulative[-1][1]
    for bound, count in cumulative:
        if count >= q * total:
            return bound if bound != float("inf") else None
    return None


def share_within(metrics: dict[str, float], histogram: str, bound: float) -> float:
    cumulative = buckets(metrics, histogram)
    return next(c for b, c in cumulative if b >= bound) / max(cumulative[-1][1], 1)


def api_requests(kube: Kube) -> dict[tuple[str, str], float]:
    """The API server's request counter (apiserver_request_total), summed by (resource, verb)."""
    with kube.stream("/metrics", [], 30, accept="text/plain") as response:
        text = response.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels["resource"] + (f"/{labels['subresource']}" if labels["subresource"] else "")
            key = (resource, labels["verb"])
            out[key] = out.get(key, 0.0) + sample.value
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def missed(f: dict[str, Any]) -> list[str]:
    """The goals a run missed: at any size, every child created, every CR Ready and no write
    at steady state; at GOAL_CRS CRs or more, the CPU per CR and the reconcile p99 too."""
    out = []
    if f["children_found"] != f["children_expected"]:
        out.append(f"{f['children_found']} of {f['children_expected']} children created")
    if f["ready"] != f["crs"]:
        out.append(f"{f['ready']} of {f['crs']} CRs Ready")
    if f["writes_per_cr_steady"] > 0:
        out.append(f"{f['writes_per_cr_steady']:.2f} API writes per CR at steady state; goal 0")
    if f["crs"] >= GOAL_CRS:
        if f["operator_cpu_per_cr_s"] > GOAL_CPU_PER_CR_S:
            out.append(f"operator CPU per CR {f['operator_cpu_per_cr_s']:.3f} s; goal "
                       f"<= {GOAL_CPU_PER_CR_S} s")
        p99 = f["reconcile_p99_s"]
        if p99 is None or p99 > GOAL_RECONCILE_P99_S:
            out.append(f"reconcile p99 {'over the last bucket' if p99 is None else f'<= {p99} s'}"
                       f"; goal <= {GOAL_RECONCILE_P99_S} s")
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crs", type=int, default=100)
    parser.add_argument("--steady-seconds", type=int, default=60)
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds to wait for every CR to be Ready")
    args = parser.parse_args()

    # Every CR runs one endpoint-picker pod (4 CPUs requested): enough simulated nodes
    # (224 CPUs, 110 pods each) that they all schedule.
    cp = ControlPlane(nodes=max(4, -(-args.crs // 50))).start()
    operator = None
    try:
        for f in [REPO / "crds" / "longctx.dev_longcontextdeployments.yaml",
                  *sorted((cp.share_dir / "crds").glob("*.yaml"))]:
            cp.kubectl("apply", "--server-side", "-f", str(f))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        cp.kubectl("create", "namespace", NAMESPACE)
        env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig),
               "PYTHONPATH": f"{REPO / 'core'}:{REPO / 'operator'}"}
        operator = OperatorProcess(cp.kubeconfig, cp.workdir / "operator.log").start()
        metrics_port = operator.metrics_port
        started = time.monotonic()
        while not operator.healthy():   # measured from here: its start is not per CR
            if time.monotonic() - started > STARTUP_SECONDS:
                raise SystemExit(f"the operator's /healthz did not answer within "
                                 f"{STARTUP_SECONDS} s:\n{operator.tail()}")
            time.sleep(0.5)
        base = yaml.safe_load((REPO / "examples" / "glm-5.3-1m.yaml").read_text())
        base["spec"]["prefill"]["replicas"] = 0
        base["spec"]["decode"]["replicas"] = 0
        rendered = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "render", "-f",
                                   "-"], input=yaml.safe_dump(base), capture_output=True,
                                  text=True, env=env, check=True).stdout
        children = [d for d in yaml.safe_load_all(rendered) if d]
        per_cr = len(children)
        crs = []
        for i in range(args.crs):
            cr = json.loads(json.dumps(base))
            cr["metadata"] = {"name": f"lcd-{i:04d}", "namespace": NAMESPACE}
            crs.append(cr)

        print(f"creating {args.crs} CRs ({per_cr} children each) ...", flush=True)
        observer = ReadyWatch(cp.kubeconfig)
        processes = {"operator": operator.proc.pid,
                     **{n: p.pid for n, p in cp.processes.items()}}
        processes["this benchmark (CR creation, a watch)"] = os.getpid()
        cpu_before = {n: cpu_seconds(pid) for n, pid in processes.items()}
        requests_before = api_requests(observer.kube)
        created_at, created_wall = time.monotonic(), time.time()
        create_all(crs)
        crs_at = time.monotonic()
        while (time.monotonic() - created_at < args.timeout
               and len(observer.ready_at) < args.crs):
            time.sleep(0.2)
        observer.stop()
        ready_at = observer.ready_at
        busy = time.monotonic() - created_at
        cpu = {n: cpu_seconds(pid) - cpu_before[n] for n, pid in processes.items()}
        at_creation = scrape(metrics_port)
        requests = api_requests(observer.kube)
        requests = {k: v - requests_before.get(k, 0.0) for k, v in requests.items()}
        expected = args.crs * per_cr
        found, last_child = children_created(observer.kube, {d["kind"] for d in children})
        time.sleep(args.steady_seconds)
        steady = scrape(metrics_port)
        latencies = sorted(t - created_at for t in ready_at.values())
        cores, all_cpu = len(os.sched_getaffinity(0)), sum(cpu.values())
        busiest = sorted(((k, v) for k, v in requests.items() if v >= args.crs / 2),
                         key=lambda kv: -kv[1])
        figures = {
            "crs": args.crs, "children_per_cr": per_cr, "crs_created_s": crs_at - created_at,
            "children_created_s": last_child - created_wall if found == expected else None,
            "children_found": found, "children_expected": expected,
            "ready": len(latencies),
            "ready_p50_s": statistics.median(latencies) if latencies else None,
            "ready_p99_s": latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
            "reconciles": steady.get(f"{RECONCILE}_count", 0),
            "reconcile_p50_s": histogram_quantile(steady, RECONCILE, 0.5),
            "reconcile_p99_s": histogram_quantile(steady, RECONCILE, 0.99),
            "reconciles_within_1s": share_within(steady, RECONCILE, 1.0),
            "queue_p50_s": histogram_quantile(steady, QUEUED, 0.5),
            "queue_p99_s": histogram_quantile(steady, QUEUED, 0.99),
            "writes_per_cr_at_creation": writes(at_creation) / args.crs,
            "steady_s": args.steady_seconds,
            "writes_per_cr_steady": (writes(steady) - writes(at_creation)) / args.crs,
            "operator_rss_mib": rss_mib(operator.proc.pid),
            "operator_cpu_per_cr_s": cpu["operator"] / args.crs,
            "cpu_s": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
            "cores": cores, "all_cpu_over_cores_s": all_cpu / cores,
            "operator_cpu_share": cpu["operator"] / all_cpu,
            "api_requests_per_cr": {f"{verb} {resource}": count / args.crs
                                    for (resource, verb), count in busiest[:REQUEST_ROWS]},
        }
        case = f"{args.crs} CRs, {cores} cores"
        Figures("operator-scale", "operator-scale").record(case, figures)
        print("\n".join(operator_scale({"operator-scale": {case: figures}})))
        failed = missed(figures)
        for goal in failed:
            print(f"MISSED: {goal}")
        return 1 if failed else 0
    finally:
        if operator:
            operator.stop(grace=30)   # may still be finishing reconciles: not measured
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
