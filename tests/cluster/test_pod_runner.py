"""The loopback kubelet: pods bound to a loopback node run as real local processes, each in
a network namespace of its own with its pod IP on the harness's bridge, with environment,
volumes, probes, restarts and deletion as a kubelet handles them. The "image" is this test
environment (sys.prefix)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.cluster.pod_network import BRIDGE, BRIDGE_IP, veth_name
from tests.cluster.pod_runner import PodRunner
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

NODE, OCTET = "loopback-test-0", 10
IMAGE = "loopback.test/python:3.11"


@pytest.fixture(scope="module")
def runner(cluster, tmp_path_factory):
    cluster.cp.add_loopback_node(NODE, OCTET, labels={"longctx.dev/test": "pod-runner"})
    r = PodRunner(cluster.kubeconfig, [NODE], image_map={IMAGE: sys.prefix},
                  workdir=tmp_path_factory.mktemp("pods"), backoff=(2.0, 4.0)).start()
    try:
        yield r
    finally:
        r.stop()
        cluster.kubectl("delete", "node", NODE, "--wait=false", check=False)


def pod(name: str, command: list[str], image: str = IMAGE, **spec) -> dict:
    container = {"name": "main", "image": image, "command": command,
                 **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"nodeSelector": {"longctx.dev/loopback": "true"},
                     "tolerations": [{"key": "longctx.dev/loopback", "operator": "Exists"}],
                     "terminationGracePeriodSeconds": 5, "containers": [container], **spec}}


def create(cluster, namespace: str, manifest: dict) -> None:
    # The ServiceAccount admission refuses pods until the namespace's "default" exists.
    wait_for(lambda: cluster.get("serviceaccount", "default", namespace), 30, "default SA")
    proc = cluster.apply(manifest, namespace)
    assert proc.returncode == 0, proc.stderr


def wait_pod(cluster, runner, namespace: str, name: str, check, what: str, timeout=30):
    """Waits until check(pod) is truthy; on a timeout the message carries the pod's status
    and its container logs."""
    try:
        return wait_for(lambda: (lambda p: p and check(p) and p)(
            cluster.get("pod", name, namespace)), timeout, what, interval=0.2)
    except AssertionError as exc:
        p = cluster.get("pod", name, namespace) or {}
        raise AssertionError(f"{exc}\nstatus: {json.dumps(p.get('status'), indent=1)}\n"
                             f"{runner.logs(namespace, name)}") from None


def main_status(p: dict) -> dict:
    return (p.get("status", {}).get("containerStatuses") or [{}])[0]


def is_ready(p: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in p.get("status", {}).get("conditions", []))


def test_http_server_becomes_ready_on_its_pod_ip(cluster, runner, namespace):
    create(cluster, namespace, pod(
        "web", ["python3", "-m", "http.server", "--bind", "$(POD_IP)", "8080"], container={
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}))
    p = wait_pod(cluster, runner, namespace, "web", is_ready, "the web pod Ready")
    status = p["status"]
    assert status["phase"] == "Running" and status["hostIP"] == BRIDGE_IP
    assert status["podIP"].startswith(f"198.18.{OCTET}.") and status["podIPs"] == [
        {"ip": status["podIP"]}]
    c = main_status(p)
    assert (c["ready"], c["started"], c["restartCount"]) == (True, True, 0)
    assert "running" in c["state"]
    with urllib.request.urlopen(f"http://{status['podIP']}:8080/", timeout=5) as resp:
        assert resp.status == 200


def test_env_volumes_and_in_cluster_client(cluster, runner, namespace):
    cluster.kubectl("create", "configmap", "cfg", "-n", namespace, "--from-literal=greeting=hi",
                    "--from-literal=model.json={\"layers\": 3}")
    cluster.kubectl("create", "secret", "generic", "creds", "-n", namespace,
                    "--from-literal=token=s3cret")
    script = ("echo NAME=$MY_NAME NS=$MY_NS NODE=$MY_NODE LABEL=$MY_LABEL G=$GREETING "
              "P=$CFG_greeting S=$SECRET MEM=$MEM HOST=$(hostname) ARG=$1; "
              "cat /etc/longctx-test/model.json; echo; "
              "python3 -c 'import kubernetes as k; k.config.load_incluster_config(); "
              "print(\"VERSION\", k.client.VersionApi().get_code().git_version)'")
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    create(cluster, namespace, pod(
        "envs", ["sh", "-c", script, "sh", "$(MY_NAME)-$(UNDEFINED)"], restartPolicy="Never",
        volumes=[{"name": "cfg", "configMap": {"name": "cfg", "items": [
            {"key": "model.json", "path": "model.json"}]}}],
        container={
            "resources": {"limits": {"memory": "64Mi"}},
            "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
            "env": [{"name": "MY_NAME", **field("metadata.name")},
                    {"name": "MY_NS", **field("metadata.namespace")},
                    {"name": "MY_NODE", **field("spec.nodeName")},
                    {"name": "MY_LABEL", **field("metadata.labels['app']")},
                    {"name": "GREETING", "valueFrom": {"configMapKeyRef": {
                        "name": "cfg", "key": "greeting"}}},
                    {"name": "SECRET", "valueFrom": {"secretKeyRef": {
                        "name": "creds", "key": "token"}}},
                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {
                        "resource": "limits.memory", "divisor": "1Mi"}}}],
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/longctx-test",
                              "readOnly": True}]}))
    p = wait_pod(cluster, runner, namespace, "envs",
                 lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "envs to end")
    out = runner.log_path(namespace, "envs", "main").read_text()
    assert p["status"]["phase"] == "Succeeded", out
    assert (f"NAME=envs NS={namespace} NODE={NODE} LABEL=envs G=hi P=hi S=s3cret MEM=64 "
            "HOST=envs ARG=envs-$(UNDEFINED)") in out
    assert '{"layers": 3}' in out
    assert "VERSION v1.37.2" in out   # the projected token, CA and KUBERNETES_SERVICE_*
    assert not os.path.exists("/etc/longctx-test/model.json")  # mounted in the pod only


def test_a_crashing_container_is_restarted_with_back_off(cluster, runner, namespace):
    create(cluster, namespace, pod("crash", ["sh", "-c", "echo boom; exit 3"]))

    def crash_looping(p):
        c = main_status(p)
        return (c.get("restartCount", 0) >= 1
                and c.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff")

    c = main_status(wait_pod(cluster, runner, namespace, "crash", crash_looping,
                             "CrashLoopBackOff after a restart"))
    last = c["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (3, "Error")
    assert "boom" in last["message"]
    assert not c["ready"]


def test_memory_empty_dir_size_limit_bounds_shared_memory(cluster, runner, namespace):
    script = ("d = b'0' * (512 * 1024); open('/dev/shm/a', 'wb').write(d); print('small ok',"
              " flush=True); open('/dev/shm/b', 'wb').write(d * 4)")
    create(cluster, namespace, pod(
        "shm", ["python3", "-c", script], restartPolicy="Never",
        volumes=[{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
        container={"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}))
    p = wait_pod(cluster, runner, namespace, "shm",
                 lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "shm to end")
    term = main_status(p)["state"]["terminated"]
    assert p["status"]["phase"] == "Failed" and term["exitCode"] == 1, term
    assert "small ok" in term["message"] and "No space left on device" in term["message"]


def test_deleting_the_pod_stops_its_process(cluster, runner, namespace):
    create(cluster, namespace, pod("sleeper", ["sleep", "3600"]))
    p = wait_pod(cluster, runner, namespace, "sleeper", is_ready, "the sleeper Ready")
    pid = int(main_status(p)["containerID"].removeprefix("loopback://"))
    assert os.path.exists(f"/proc/{pid}")
    cluster.kubectl("delete", "pod", "sleeper", "-n", namespace, "--wait=false")
    wait_for(lambda: cluster.get("pod", "sleeper", namespace) is None, 20, "the pod finalized")
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 5, f"process {pid} gone")


def test_an_unmapped_image_is_reported_as_a_pull_error(cluster, runner, namespace):
    image = "registry.invalid/nothing:1"
    create(cluster, namespace, pod("noimage", ["true"], image=image))
    p = wait_pod(cluster, runner, namespace, "noimage",
                 lambda p: "waiting" in main_status(p).get("state", {})
                 and main_status(p)["state"]["waiting"].get("reason") == "ErrImagePull",
                 "ErrImagePull")
    assert image in main_status(p)["state"]["waiting"]["message"]
    assert p["status"]["phase"] == "Pending"


def wildcard_server(name: str, reply: str) -> dict:
    """A pod whose server binds [::]:8000, as llm-d's sidecar does, and answers `reply`."""
    script = ("import http.server, socket\n"
              "class S(http.server.ThreadingHTTPServer): address_family = socket.AF_INET6\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              f"        self.send_response(200); self.end_headers(); self.wfile.write(b'{reply}')\n"
              "S(('::', 8000), H).serve_forever()\n")
    return pod(name, ["python3", "-c", script], container={
        "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}})


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def test_pods_bind_the_wildcard_address_each_in_its_own_network(cluster, runner, namespace):
    for name in ("wild-a", "wild-b"):
        create(cluster, namespace, wildcard_server(name, name))
    ips = {name: wait_pod(cluster, runner, namespace, name, is_ready, f"{name} Ready")[
        "status"]["podIP"] for name in ("wild-a", "wild-b")}
    assert ips["wild-a"] != ips["wild-b"]
    for name, ip in ips.items():   # the same port, each pod's own
        assert fetch(f"http://{ip}:8000/") == name
    # Pod to pod over the bridge. A pod's 127.0.0.1 is its own loopback: the API server,
    # which listens on the host's, is reached at the bridge address (KUBERNETES_SERVICE_HOST).
    api = runner.kube.port
    probe = ("import socket, urllib.request\n"
             f"print('PEER', urllib.request.urlopen('http://{ips['wild-b']}:8000/').read())\n"
             "try:\n"
             f"    socket.create_connection(('127.0.0.1', {api}), 2); print('HOST LOOPBACK')\n"
             "except OSError:\n"
             "    print('OWN LOOPBACK')\n"
             f"socket.create_connection(('{BRIDGE_IP}', {api}), 2); print('API AT BRIDGE')\n"
             "print(socket.gethostbyname(socket.gethostname()))\n")   # the pod's /etc/hosts
    create(cluster, namespace, pod("peer", ["python3", "-c", probe], restartPolicy="Never"))
    p = wait_pod(cluster, runner, namespace, "peer",
                 lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "peer to end")
    out = runner.log_path(namespace, "peer", "main").read_text()
    assert p["status"]["phase"] == "Succeeded", out
    assert out.splitlines() == ["PEER b'wild-b'", "OWN LOOPBACK", "API AT BRIDGE",
                                p["status"]["podIP"]], out
    # Nothing is routed off the machine: the harness never turns forwarding on.
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"


def test_a_volume_at_tmp_hides_no_other_volume(cluster, runner, namespace):
    """The pod directory (volume sources) lives under the runner's workdir in /tmp; an
    emptyDir over /tmp must hide neither the token nor the configMap."""
    assert str(runner.workdir).startswith("/tmp/")
    cluster.kubectl("create", "configmap", "tmpcfg", "-n", namespace, "--from-literal=k=v1")
    script = ("cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; "
              "cat /etc/tmpcfg/k; echo; echo scratch > /tmp/only-in-the-pod; ls /tmp")
    create(cluster, namespace, pod(
        "tmpvol", ["sh", "-c", script], restartPolicy="Never",
        volumes=[{"name": "scratch", "emptyDir": {}},
                 {"name": "cfg", "configMap": {"name": "tmpcfg"}}],
        container={"volumeMounts": [{"name": "scratch", "mountPath": "/tmp"},
                                    {"name": "cfg", "mountPath": "/etc/tmpcfg"}]}))
    p = wait_pod(cluster, runner, namespace, "tmpvol",
                 lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "tmpvol to end")
    out = runner.log_path(namespace, "tmpvol", "main").read_text()
    assert p["status"]["phase"] == "Succeeded", out
    assert out.splitlines()[:3] == [namespace, "v1", "only-in-the-pod"], out
    assert not os.path.exists("/tmp/only-in-the-pod")


def test_a_pod_deleted_while_starting_leaves_nothing_behind(cluster, runner, namespace):
    """Deleted at each step of its start (IP taken, volumes being written, sandbox and veth
    being made), gracefully or at once: its processes, veth and IP reservation go, and the
    next pod of the same name starts and serves."""
    wait_for(lambda: cluster.get("serviceaccount", "default", namespace), 30, "default SA")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    blocked = wildcard_server("starting", "blocked")   # its configMap does not exist yet
    blocked["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "not-yet"}}]
    blocked["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    gone = []
    for i, delay in enumerate((3.0, 0.0, 0.05, 0.15, 0.3, 0.6, 1.0)):
        manifest = blocked if i == 0 else wildcard_server("starting", "old")
        uid = runner.kube.call("POST", pods, manifest)["metadata"]["uid"]
        if i == 0:   # held at its volumes with its IP taken
            p = wait_pod(cluster, runner, namespace, "starting", lambda p: p["status"].get(
                "podIP") and main_status(p).get("state", {}).get("waiting", {}).get(
                    "reason") == "ContainerCreating", "the IP taken, volumes pending")
        time.sleep(delay)
        p = runner.kube.get(f"{pods}/starting") or {}
        runner.kube.call("DELETE", f"{pods}/starting", {
            "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0 if i % 2 else 5,
            "preconditions": {"uid": uid}})
        wait_for(lambda: runner.kube.get(f"{pods}/starting") is None, 30,
                 f"pod {uid} finalized", interval=0.1)
        gone.append((uid, (p.get("status") or {}).get("podIP"),
                     [int(c["containerID"].removeprefix("loopback://"))
                      for c in (p.get("status") or {}).get("containerStatuses", [])
                      if c.get("containerID")]))
    create(cluster, namespace, wildcard_server("starting", "next"))
    p = wait_pod(cluster, runner, namespace, "starting", is_ready, "the next pod Ready")
    assert fetch(f"http://{p['status']['podIP']}:8000/") == "next"
    # The runner has handled every earlier event by now (the watch delivers them in order).
    assert gone[0][0] in runner._finished   # the pod held at its volumes was seen and ended
    for uid, ip, pids in gone:
        wait_for(lambda: uid not in runner.workers, 30, f"pod {uid} cleaned up", interval=0.1)
        assert not Path(f"/sys/class/net/{veth_name(uid)}").exists(), uid
        assert ip == p["status"]["podIP"] or not (ip and runner.network.reserved(ip)), (uid, ip)
        assert not any(os.path.exists(f"/proc/{pid}") for pid in pids), (uid, pids)
    ports = os.listdir(f"/sys/class/net/{BRIDGE}/brif")
    assert veth_name(p["metadata"]["uid"]) in ports


def grpc_health_server(name: str, service: str, serving_flag: Path, checks: Path) -> dict:
    """A pod serving grpc.health.v1 on port 9003: NOT_SERVING for `service` until the file
    `serving_flag` exists, SERVING after; it appends a line to `checks` per check answered.
    Unknown services get NOT_FOUND, as grpc's own health servicer answers them."""
    script = ("import grpc, os\n"
              "from concurrent import futures\n"
              "def check(request, context):\n"
              f"    with open({str(checks)!r}, 'a') as f: f.write('check\\n')\n"
              f"    if request[2:].decode() != {service!r}:\n"
              "        context.abort(grpc.StatusCode.NOT_FOUND, 'unknown service')\n"
              f"    return b'\\x08\\x01' if os.path.exists({str(serving_flag)!r}) else b'\\x08\\x02'\n"
              "handler = grpc.method_handlers_generic_handler('grpc.health.v1.Health', {\n"
              "    'Check': grpc.unary_unary_rpc_method_handler(check)})\n"
              "server = grpc.server(futures.ThreadPoolExecutor(2))\n"
              "server.add_generic_rpc_handlers((handler,))\n"
              "server.add_insecure_port('[::]:9003')\n"
              "server.start(); server.wait_for_termination()\n")
    return pod(name, ["python3", "-c", script], container={
        "ports": [{"name": "grpc-health", "containerPort": 9003}],
        "readinessProbe": {"grpc": {"port": 9003, "service": service}, "periodSeconds": 1}})


def test_grpc_probes_use_the_grpc_health_protocol(cluster, runner, namespace, tmp_path):
    """A grpc probe is the standard health check for the probe's service: NOT_SERVING keeps
    the pod un-Ready, SERVING makes it Ready (llm-d's picker is probed this way)."""
    flag, checks = tmp_path / "serving", tmp_path / "checks"
    create(cluster, namespace, grpc_health_server("health", "inference-extension", flag, checks))
    wait_pod(cluster, runner, namespace, "health",
             lambda p: main_status(p).get("started"), "the health server running")
    # Evidence that probes ran and were answered NOT_SERVING, then the negative assertion.
    wait_for(lambda: checks.exists() and len(checks.read_text().splitlines()) >= 3, 30,
             "three gRPC health checks answered")
    assert not is_ready(cluster.get("pod", "health", namespace))
    flag.touch()
    wait_pod(cluster, runner, namespace, "health", is_ready, "Ready once SERVING")
