"""Scaling in P/D units on the real control plane: `kubectl scale` through the CR's /scale,
a real HPA reconciled by the real kube-controller-manager writing /scale, and topology
pairing placed by the real kube-scheduler.

The HPA's metric comes from an External metrics API that this test serves itself: a
loopback HTTPS server registered with the real aggregator as external.metrics.k8s.io
(an APIService on an ExternalName Service "localhost"), so the test sets the value the HPA
reads. This exercises everything past the metrics adapter: the HPA's metric spec, the
per-unit averaging, /scale reads and writes and the operator following spec.replicas.
The vLLM-metrics half (the recording rules) is covered with the real promtool in
tests/operator/test_autoscaling.py. KEDA was not built: its operator and metrics server are
a large Go build for a path that ends in the same HPA on the same /scale.
"""

from __future__ import annotations

import datetime
import json
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
import yaml

from tests.cluster.processes import free_port
from tests.cluster.sampling import PoolSampler
from tests.cluster.test_reconcile import condition
from tests.conftest import example_cr, wait_for

pytestmark = pytest.mark.cluster

GROUP_VERSION = "external.metrics.k8s.io/v1beta1"
DRAIN_SECONDS = 3
RACK = "example.com/rack"


def units_cr(replicas: int | None = 1, prefill: int = 1, decode: int = 1, **spec) -> dict:
    """The example scaled in P/D units (no per-role replicas)."""
    cr = example_cr()
    for role in ("prefill", "decode"):
        cr["spec"][role].pop("replicas", None)
    if replicas is not None:
        cr["spec"]["replicas"] = replicas
    cr["spec"]["scaling"] = {"prefillPerUnit": prefill, "decodePerUnit": decode}
    cr["spec"]["rollout"] = {"drainSeconds": DRAIN_SECONDS}
    cr["spec"].update(spec)
    return cr


def role_replicas(cluster, namespace: str) -> dict[str, int]:
    """spec.replicas of each role's StatefulSets (all revisions)."""
    out = {}
    for role in ("prefill", "decode"):
        items = cluster.list("statefulset", namespace,
                             f"app.kubernetes.io/instance=glm,app.kubernetes.io/component={role}")
        out[role] = sum(s["spec"]["replicas"] for s in items)
    return out


def scale(cluster, namespace: str) -> dict:
    return json.loads(cluster.kubectl(
        "get", "--raw",
        f"/apis/longctx.dev/v1alpha1/namespaces/{namespace}/longcontextdeployments/glm/scale"
    ).stdout)


def test_kubectl_scale_keeps_the_ratio_up_and_down(cluster, operator, namespace):
    assert cluster.apply(units_cr(1, prefill=1, decode=2), namespace).returncode == 0
    wait_for(lambda: role_replicas(cluster, namespace) == {"prefill": 1, "decode": 2}, 60,
             "one unit: 1 prefill and 2 decode pods")

    for units, want in ((2, {"prefill": 2, "decode": 4}), (1, {"prefill": 1, "decode": 2})):
        proc = cluster.kubectl("scale", "lcd", "glm", "-n", namespace, f"--replicas={units}",
                               check=False)
        assert proc.returncode == 0, proc.stderr
        wait_for(lambda: role_replicas(cluster, namespace) == want, 60, f"{units} unit(s)")
        got = wait_for(lambda: (s := scale(cluster, namespace))["status"].get(
            "replicas") == units and s, 60, f"/scale status.replicas {units}")
        assert got["spec"]["replicas"] == units
        assert got["status"]["selector"] == ("app.kubernetes.io/instance=glm,"
                                             "llm-d.ai/inference-serving=true")
        pods = cluster.list("pods", namespace, got["status"]["selector"])
        assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == {
            "prefill", "decode"}


def test_scale_down_takes_pods_out_of_the_pool_before_deleting_them(cluster, operator,
                                                                    namespace):
    assert cluster.apply(units_cr(2), namespace).returncode == 0
    wait_for(lambda: len([p for p in cluster.list("pods", namespace, SERVING) if ready(p)])
             == 4, 120, "two units Ready")
    sampler = PoolSampler(namespace, "glm")
    sampler.start()
    try:
        assert cluster.kubectl("scale", "lcd", "glm", "-n", namespace, "--replicas=1",
                               check=False).returncode == 0
        wait_for(lambda: role_replicas(cluster, namespace) == {"prefill": 1, "decode": 1} and
                 len(cluster.list("pods", namespace, "app.kubernetes.io/instance=glm,"
                                  "app.kubernetes.io/component in (prefill,decode)")) == 2,
                 60, "one unit left")
        last = sampler.until(lambda s: len(s.pods) == 2, 30, "one unit's pods left")
    finally:
        sampler.stop.set()
        sampler.join()
    samples = sampler.samples
    removed = samples[0].pods - last.pods
    assert len(removed) == 2, removed          # one prefill and one decode pod
    left_pool = next(s for s in samples if not removed & set().union(*s.ready.values()))
    assert removed <= left_pool.pods, "deleted before leaving the pool"
    assert last.t - left_pool.t >= DRAIN_SECONDS * 0.8, "not drained"
    assert all(s.ready["prefill"] and s.ready["decode"] for s in samples)


SERVING = "app.kubernetes.io/instance=glm,llm-d.ai/inference-serving=true"


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def test_scale_on_a_deployment_with_per_role_replicas_takes_over(cluster, operator, namespace):
    """The example names prefill.replicas and decode.replicas; `kubectl scale` still works:
    spec.replicas, once set, is the one source of each role's pods."""
    assert cluster.apply(example_cr(), namespace).returncode == 0
    wait_for(lambda: role_replicas(cluster, namespace) == {"prefill": 1, "decode": 1}, 60,
             "the example's pods")
    cluster.kubectl("scale", "lcd", "glm", "-n", namespace, "--replicas=2")
    wait_for(lambda: role_replicas(cluster, namespace) == {"prefill": 2, "decode": 2}, 60,
             "2 units")


# ---------------------------------------------------------------- a settable External metric


def _self_signed(tmp_path) -> ssl.SSLContext:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    return ctx


class ExternalMetrics:
    """external.metrics.k8s.io/v1beta1 on 127.0.0.1, serving values the test sets, and the
    label selectors the HPA asked with."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.queries: list[tuple[str, str]] = []

    def handler(self):
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if url.path.rstrip("/") == f"/apis/{GROUP_VERSION}":
                    body = {"kind": "APIResourceList", "apiVersion": "v1",
                            "groupVersion": GROUP_VERSION, "resources": []}
                elif len(parts) == 6 and parts[3] == "namespaces":
                    metric = urllib.parse.unquote(parts[5])
                    selector = urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0]
                    metrics.queries.append((metric, selector))
                    items = [] if metric not in metrics.values else [{
                        "metricName": metric, "metricLabels": {},
                        "timestamp": datetime.datetime.now(datetime.timezone.utc).strftime(
                            "%Y-%m-%dT%H:%M:%SZ"),
                        "value": f"{round(metrics.values[metric] * 1000)}m"}]
                    body = {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION,
                            "metadata": {}, "items": items}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


@pytest.fixture
def external_metrics(cluster, tmp_path) -> Iterator[ExternalMetrics]:
    metrics = ExternalMetrics()
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), metrics.handler())
    server.socket = _self_signed(tmp_path).wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    objects = [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "longctx-test-external-metrics", "namespace": "default"},
         "spec": {"type": "ExternalName", "externalName": "localhost"}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
         "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                  "insecureSkipTLSVerify": True, "groupPriorityMinimum": 100,
                  "versionPriority": 100,
                  "service": {"namespace": "default", "name": "longctx-test-external-metrics",
                              "port": port}}},
    ]
    manifest = "\n---\n".join(yaml.safe_dump(o) for o in objects)
    cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        cluster.kubectl("wait", "--for=condition=Available", "--timeout=60s",
                        "apiservice/v1beta1.external.metrics.k8s.io")
        yield metrics
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", input=manifest, check=False)
        server.shutdown()


def _hpa_condition(hpa: dict, type_: str) -> dict:
    return next((c for c in hpa.get("status", {}).get("conditions", []) if c["type"] == type_),
                {})


def test_a_real_hpa_scales_units_through_scale(cluster, operator, namespace,
                                               external_metrics):
    cr = units_cr(1, autoscaling={"minUnits": 1, "maxUnits": 3, "scaleDownStabilizationSeconds": 0,
                                  "metrics": {"decodeCapacityPercent": 0,
                                              "waitingRequestsPerUnit": 2}})
    assert cluster.apply(cr, namespace).returncode == 0
    hpa = wait_for(lambda: cluster.get("hpa", "glm", namespace), 30, "the operator's HPA")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "longctx.dev/v1alpha1",
                                             "kind": "LongContextDeployment", "name": "glm"}
    wait_for(lambda: role_replicas(cluster, namespace) == {"prefill": 1, "decode": 1}, 60,
             "one unit")

    # 5 waiting requests over 1 unit against 2 per unit: ceil(5 / 2) = 3 units.
    external_metrics.values["longctx:waiting_requests"] = 5
    wait_for(lambda: cluster.get("lcd", "glm", namespace)["spec"].get("replicas") == 3, 90,
             "the HPA writing 3 units to /scale")
    wait_for(lambda: role_replicas(cluster, namespace) == {"prefill": 3, "decode": 3}, 60,
             "3 units of pods")
    hpa = wait_for(lambda: (h := cluster.get("hpa", "glm", namespace)) and _hpa_condition(
        h, "ScalingActive").get("status") == "True" and h, 60, "ScalingActive")
    assert _hpa_condition(hpa, "AbleToScale")["status"] == "True", hpa["status"]
    assert ("longctx:waiting_requests", "longcontextdeployment=glm") in external_metrics.queries

    external_metrics.values["longctx:waiting_requests"] = 0
    wait_for(lambda: cluster.get("lcd", "glm", namespace)["spec"].get("replicas") == 1, 90,
             "the HPA scaling back to minUnits")
    wait_for(lambda: role_replicas(cluster, namespace) == {"prefill": 1, "decode": 1}, 60,
             "one unit again")


# ---------------------------------------------------------------- topology


@pytest.fixture
def racks(cluster) -> Iterator[dict[str, str]]:
    nodes = {"h200-0": "a", "h200-1": "a", "h200-2": "b", "h200-3": "b"}
    # Every GPU is needed: wait for the pods of earlier tests' namespaces to be gone.
    wait_for(lambda: not [p for p in json.loads(cluster.kubectl(
        "get", "pods", "-A", "-o", "json").stdout)["items"]
        if p["spec"].get("nodeName") in nodes], 120, "the simulated nodes free")
    for node, rack in nodes.items():
        cluster.kubectl("label", "node", node, f"{RACK}={rack}", "--overwrite")
    try:
        yield nodes
    finally:
        for node in nodes:
            cluster.kubectl("label", "node", node, f"{RACK}-", check=False)


def test_topology_key_places_each_units_decode_beside_its_prefill(cluster, operator,
                                                                 namespace, racks):
    cr = units_cr(2, placement={**example_cr()["spec"].get("placement", {}),
                                "topologyKey": RACK})
    assert cluster.apply(cr, namespace).returncode == 0

    def placed():
        pods = cluster.list("pods", namespace, "app.kubernetes.io/instance=glm,"
                            "llm-d.ai/inference-serving=true")
        where = {(p["metadata"]["labels"]["app.kubernetes.io/component"],
                  p["metadata"]["labels"]["apps.kubernetes.io/pod-index"]):
                 p["spec"].get("nodeName") for p in pods}
        return len(where) == 4 and all(where.values()) and where

    where = wait_for(placed, 90, "4 pods scheduled")
    for index in ("0", "1"):
        assert racks[where[("decode", index)]] == racks[where[("prefill", index)]], where
    got = wait_for(lambda: (c := condition(cluster, namespace, "glm", "TopologySatisfiable"))
                   and c["status"] == "True" and c, 60, "TopologySatisfiable=True")
    assert got["reason"] == "DomainFits"


def test_an_unsatisfiable_topology_key_says_why(cluster, operator, namespace):
    key = "example.com/nvlink-domain"
    cr = units_cr(1, placement={**example_cr()["spec"].get("placement", {}), "topologyKey": key})
    assert cluster.apply(cr, namespace).returncode == 0
    got = wait_for(lambda: (c := condition(cluster, namespace, "glm", "TopologySatisfiable"))
                   and c["status"] == "False" and c, 60, "TopologySatisfiable=False")
    assert got["reason"] == "NoDomainFits"
    assert f"spec.placement.topologyKey is {key}, but none of the" in got["message"]
    assert f"kubectl label node <node> {key}=<domain>" in got["message"]
    plan = cluster.get("lcd", "glm", namespace)["status"]["plan"]["topology"]
    assert plan["satisfiable"] is False and plan["domains"] == {}
