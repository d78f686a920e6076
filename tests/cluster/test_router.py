"""The llm-d router on the real control plane.

A CR becomes an InferencePool, the endpoint picker's Deployment, Service, ConfigMap,
ServiceAccount, Role and RoleBinding, and a decode routing sidecar, all owned by the CR and
garbage-collected with it. The picker's credentials (a TokenRequest token for its
ServiceAccount) can do exactly what the picker does at start and nothing more. When the
picker binary is in the cache (tools/build-epp.sh) it runs against the control plane on
127.0.0.1 with those credentials and the generated config and must report SERVING.

Network rule: only 127.0.0.1 is ever contacted; pod and Service IPs are fake.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cluster.picker import picker_kubeconfig, picker_process, upstream_picker
from tests.conftest import example_cr, sts_name, wait_for

pytestmark = pytest.mark.cluster

ROUTER_KINDS = (("inferencepool", "glm"), ("deployment", "glm-epp"), ("service", "glm-epp"),
                ("configmap", "glm-epp"), ("serviceaccount", "glm-epp"), ("role", "glm-epp"),
                ("rolebinding", "glm-epp"))


def _owned_by(obj: dict, uid: str) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r["uid"] == uid and r["kind"] == "LongContextDeployment" and r.get("controller")
               for r in refs)


def _apply_and_wait(cluster, namespace: str, cr: dict) -> str:
    proc = cluster.apply(cr, namespace)
    assert proc.returncode == 0, proc.stderr
    lcd = wait_for(lambda: cluster.get("lcd", cr["metadata"]["name"], namespace), 10, "the CR")
    for kind, name in ROUTER_KINDS:
        wait_for(lambda: cluster.get(kind, name, namespace), 60, f"{kind} {name}")
    return lcd["metadata"]["uid"]


def test_router_objects_exist_with_ports_labels_args_and_are_collected(cluster, operator,
                                                                       namespace):
    uid = _apply_and_wait(cluster, namespace, example_cr("glm"))
    objects = {kind: cluster.get(kind, name, namespace) for kind, name in ROUTER_KINDS}
    for kind, obj in objects.items():
        assert _owned_by(obj, uid), f"{kind} is not owned by the CR"
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "glm"
        assert labels["app.kubernetes.io/component"] == "router"
        assert labels["app.kubernetes.io/managed-by"] == "longctx-operator"

    pool = objects["inferencepool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    selector = pool["spec"]["selector"]["matchLabels"]
    assert {k: v for k, v in selector.items() if k != "longctx.dev/pairing"} == {
        "app.kubernetes.io/instance": "glm", "llm-d.ai/inference-serving": "true"}
    # The pool selects exactly the serving pods of this engine version: every engine pod.
    query = ",".join(f"{k}={v}" for k, v in selector.items())
    wait_for(lambda: sorted(p["metadata"]["name"] for p in cluster.list("pods", namespace, query))
             == [f"{sts_name(example_cr(), r)}-0" for r in ("decode", "prefill")], 60,
             "both engine pods selected by the pool")
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == list(range(8000, 8008))
    ref = pool["spec"]["endpointPickerRef"]
    assert (ref["kind"], ref["name"], ref["port"]["number"], ref["failureMode"]) == (
        "Service", "glm-epp", 9002, "FailOpen")

    dep = objects["deployment"]
    pod = dep["spec"]["template"]["spec"]
    (epp,) = pod["containers"]
    for arg in ("--pool-name=glm", f"--pool-namespace={namespace}",
                "--pool-group=inference.networking.k8s.io",
                "--config-file=/config/epp-config.yaml", "--grpc-port=9002",
                "--grpc-health-port=9003", "--metrics-port=9090"):
        assert arg in epp["args"], arg
    assert {p["name"]: p["containerPort"] for p in epp["ports"]} == {
        "grpc": 9002, "grpc-health": 9003, "metrics": 9090}
    assert epp["readinessProbe"]["grpc"]["port"] == 9003
    assert pod["serviceAccountName"] == "glm-epp"
    config_text = objects["configmap"]["data"]["epp-config.yaml"]
    config = yaml.safe_load(config_text)
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert dep["spec"]["template"]["metadata"]["annotations"][
        "longctx.dev/picker-config-sha256"] == hashlib.sha256(config_text.encode()).hexdigest()

    svc = objects["service"]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {
        "grpc-ext-proc": 9002, "http-metrics": 9090}

    rules = objects["role"]["rules"]
    verbs = {v for r in rules for v in r["verbs"]}
    assert verbs == {"get", "list", "watch"}

    # The decode pods' routing sidecar: native sidecar, 8 rank ports, forwarding to 8200+.
    decode = sts_name(example_cr(), "decode")
    sts = wait_for(lambda: cluster.get("statefulset", decode, namespace), 60,
                   f"StatefulSet {decode}")
    init = {c["name"]: c for c in sts["spec"]["template"]["spec"].get("initContainers", [])}
    sidecar = init["routing-proxy"]
    assert sidecar["restartPolicy"] == "Always"
    for arg in ("--kv-connector=nixlv2", "--data-parallel-size=8", "--port=8000",
                "--model-server-port=8200", "--secure-proxy=false"):
        assert arg in sidecar["args"], arg
    assert [p["containerPort"] for p in sidecar["ports"]] == list(range(8000, 8008))
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/role"] == "decode" and labels["llm-d.ai/inference-serving"] == "true"

    # Deleting the CR removes every router object (garbage collector).
    cluster.kubectl("delete", "lcd", "glm", "-n", namespace, "--wait=false")

    def gone():
        left = [f"{k}/{n}" for k, n in ROUTER_KINDS if cluster.get(k, n, namespace) is not None]
        return True if not left else None

    wait_for(gone, 90, "router objects to be garbage-collected", interval=2)


def test_serving_pods_announce_only_the_ports_they_serve(cluster, operator, namespace):
    """The picker makes one endpoint per (pod, pool target port) unless the pod lists its
    ports in llm-d.ai/active-ports: a PCP8 prefill pod serves one port of the eight."""
    from longctx_core import contract
    from longctx_core.api import spec as api
    from longctx_core.plan.roles import serving_plan
    from longctx_operator.controller.builders import router

    cr = example_cr("glm")
    _apply_and_wait(cluster, namespace, cr)
    plan = serving_plan(api.load_spec(cr["spec"]))
    for role in ("prefill", "decode"):
        sts = wait_for(lambda: cluster.get("statefulset", sts_name(cr, role), namespace), 60,
                       f"StatefulSet {sts_name(cr, role)}")
        annotations = sts["spec"]["template"]["metadata"].get("annotations") or {}
        assert annotations[contract.ACTIVE_PORTS_ANNOTATION] == \
            router.pod_annotations(plan.role(role))[contract.ACTIVE_PORTS_ANNOTATION]
    assert cluster.get("inferencepool", "glm", namespace)["spec"]["targetPorts"] == [
        {"number": p} for p in plan.pool_target_ports]


# ---------------------------------------------------------------- the picker's credentials


def _as_picker(cluster, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(cluster.bin_dir) / "kubectl"), "--kubeconfig",
                           str(kubeconfig), *args], capture_output=True, text=True, timeout=60)


def test_picker_credentials_do_what_the_picker_needs_and_no_more(cluster, operator, namespace,
                                                                tmp_path):
    _apply_and_wait(cluster, namespace, example_cr("glm"))
    kubeconfig = picker_kubeconfig(cluster, namespace, "glm-epp", tmp_path)

    # What the picker does at start (pkg/epp/server/controller_manager.go): the pool by name,
    # pods of the pool in its namespace (list + watch), objectives and rewrites.
    pool = _as_picker(cluster, kubeconfig, "get", "inferencepools.inference.networking.k8s.io",
                      "--field-selector", "metadata.name=glm", "-o", "json")
    assert pool.returncode == 0, pool.stderr
    assert [i["metadata"]["name"] for i in json.loads(pool.stdout)["items"]] == ["glm"]
    pods = _as_picker(cluster, kubeconfig, "get", "pods", "-l",
                      "app.kubernetes.io/instance=glm,llm-d.ai/inference-serving=true", "-o", "name")
    assert pods.returncode == 0, pods.stderr
    watch = _as_picker(cluster, kubeconfig, "get", "pods", "--watch", "--request-timeout=2s")
    assert "forbidden" not in watch.stderr.lower(), watch.stderr

    def can(verb: str, resource: str, namespace_: str | None = namespace) -> bool:
        """A SelfSubjectAccessReview as the picker (no discovery: CRDs need not exist)."""
        name, _, group = resource.partition(".")
        attrs = {"verb": verb, "resource": name, "group": group}
        if namespace_:
            attrs["namespace"] = namespace_
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": attrs}}
        proc = subprocess.run([str(Path(cluster.bin_dir) / "kubectl"), "--kubeconfig",
                               str(kubeconfig), "create", "--validate=false", "-f", "-", "-o",
                               "json"],
                              input=json.dumps(review), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return bool(json.loads(proc.stdout)["status"].get("allowed"))

    for verb in ("get", "list", "watch"):
        for resource in ("pods", "inferencepools.inference.networking.k8s.io",
                         "inferenceobjectives.llm-d.ai", "inferencemodelrewrites.llm-d.ai",
                         "inferenceobjectives.inference.networking.x-k8s.io",
                         "inferencemodelrewrites.inference.networking.x-k8s.io"):
            assert can(verb, resource), f"the picker cannot {verb} {resource}"
    for verb, resource, ns in (
            ("list", "secrets", namespace), ("get", "configmaps", namespace),
            ("create", "pods", namespace), ("delete", "pods", namespace),
            ("update", "inferencepools.inference.networking.k8s.io", namespace),
            ("patch", "inferencepools.inference.networking.k8s.io", namespace),
            ("list", "pods", "default"), ("list", "pods", None),
            ("create", "leases.coordination.k8s.io", namespace), ("list", "nodes", None),
            ("create", "tokenreviews.authentication.k8s.io", None)):
        assert not can(verb, resource, ns), f"the picker may {verb} {resource} in {ns or 'all'}"


# ---------------------------------------------------------------- the real picker


def _run_picker_until_serving(binary: Path, args: list[str], kubeconfig: Path, namespace: str,
                              tmp_path: Path, timeout: float = 90) -> str:
    """Runs a picker until its gRPC health on 127.0.0.1 says SERVING; returns its log."""
    with picker_process(binary, args, kubeconfig, namespace, "glm", tmp_path) as picker:
        picker.wait_serving(timeout)
    return picker.log_path.read_text()


def _no_engine_pods_cr() -> dict:
    # No engine pods: the picker then has no endpoint whose (fake) pod IP it would scrape.
    return example_cr("glm", prefill__replicas=0, decode__replicas=0)


def test_upstream_picker_syncs_the_pool_with_the_generated_credentials(cluster, operator,
                                                                      namespace, tmp_path):
    """The upstream Gateway API Inference Extension EPP (the controller-manager code the
    llm-d picker derives from) with the generated InferencePool and the picker's Role only:
    it reports SERVING once it has read the pool, so the Role lets a real picker start. It
    cannot load the llm-d config (other apiVersion and plugins), so it runs its defaults."""
    binary = upstream_picker()
    _apply_and_wait(cluster, namespace, _no_engine_pods_cr())
    kubeconfig = picker_kubeconfig(cluster, namespace, "glm-epp", tmp_path)
    log = _run_picker_until_serving(binary, [], kubeconfig, namespace, tmp_path)
    assert "forbidden" not in log.lower(), log[-4000:]
    assert "Reconciling InferencePool" in log, log[-4000:]  # it read our pool


def _endpoints_in_log(log: str, namespace: str) -> dict[str, set[int]]:
    """pod name -> ports the picker made endpoints for, from its TRACE dump of the datastore
    ("Current Pods and metrics gathered": EndpointMetadata{NamespacedName, PodName, Address,
    Port, ...} of every endpoint, fresh and stale)."""
    import re

    found: dict[str, set[int]] = {}
    for line in log.splitlines():
        if "Current Pods and metrics gathered" not in line:
            continue
        found = {}
        for pod, port in re.findall(
                rf"NamespacedName:{re.escape(namespace)}/\S+?-rank-\d+ PodName:(\S+) "
                r"Address:\S+ Port:(\d+)", line):
            found.setdefault(pod, set()).add(int(port))
    return found


def test_picker_offers_each_pod_only_the_ports_it_serves(cluster, operator, namespace, tmp_path):
    """The port layout, proven with a real picker datastore (the upstream EPP's, which
    llm-d-router's is derived from): with pool targetPorts 8000-8007, a PCP8 prefill pod
    annotated by `router.pod_annotations` is one endpoint (8000), a DP8 decode pod eight,
    and an unannotated pod would be eight (seven of them nonexistent).

    The serving pods are created here on a node kwok does not manage, with loopback pod IPs
    (127.0.0.42-44), so whatever the picker dials stays on this machine."""
    from longctx_core import contract
    from longctx_core.api import spec as api
    from longctx_core.plan.revision import pairing_key
    from longctx_core.plan.roles import serving_plan
    from longctx_operator.controller.builders import router

    binary = upstream_picker()
    cr = _no_engine_pods_cr()
    _apply_and_wait(cluster, namespace, cr)
    spec = api.load_spec(cr["spec"])
    assert [p["number"] for p in cluster.get("inferencepool", "glm", namespace)["spec"][
        "targetPorts"]] == list(range(8000, 8008))

    node = f"router-{namespace}"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"type": "test"}},
        "spec": {"taints": [{"key": "longctx.dev/test", "effect": "NoSchedule"}]}}))
    plan = serving_plan(spec)
    pods = {"glm-prefill-0": ("prefill", router.pod_annotations(plan.prefill), "127.0.0.42"),
            "glm-decode-0": ("decode", router.pod_annotations(plan.decode), "127.0.0.43"),
            "glm-unannotated-0": ("prefill", {}, "127.0.0.44")}
    try:
        for name, (role, pod_annotations, ip) in pods.items():
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {
                    **contract.serving_selector("glm", pairing_key(spec)), "llm-d.ai/role": role},
                    "annotations": pod_annotations},
                "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "none"}],
                         "tolerations": [{"operator": "Exists"}]}}))
            status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                      "conditions": [{"type": "Ready", "status": "True"}]}
            cluster.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status",
                            "--type=merge", "-p", json.dumps({"status": status}))
        kubeconfig = picker_kubeconfig(cluster, namespace, "glm-epp", tmp_path)

        # Run until the datastore dump shows the three pods, then stop the picker.
        with picker_process(binary, ["--v=5"], kubeconfig, namespace, "glm", tmp_path) as picker:
            binary_log = picker.log_path

            def dumped():
                if not binary_log.exists():
                    return None
                eps = _endpoints_in_log(binary_log.read_text(), namespace)
                return eps if set(eps) == set(pods) else None

            endpoints = wait_for(dumped, 60, "the picker's datastore dump of the three pods",
                                 interval=1)
        assert "forbidden" not in binary_log.read_text().lower()
        assert endpoints["glm-prefill-0"] == set(plan.prefill.ports.serving) == {8000}
        assert endpoints["glm-decode-0"] == set(plan.decode.ports.serving) == \
            set(range(8000, 8008))
        assert endpoints["glm-unannotated-0"] == set(range(8000, 8008))  # why the annotation
    finally:
        cluster.kubectl("delete", "pod", *pods, "-n", namespace, "--force", "--grace-period=0",
                        "--wait=false", check=False)
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
