"""The loopback kubelet: pods bound to a loopback node run as real local processes, with
their pod IP in 127.0.0.0/8, environment, volumes, probes, restarts and deletion as a
kubelet handles them. The "image" is this test environment (sys.prefix)."""

from __future__ import annotations

import json
import os
import sys
import urllib.request

import pytest

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


def test_http_server_becomes_ready_on_its_loopback_ip(cluster, runner, namespace):
    create(cluster, namespace, pod(
        "web", ["python3", "-m", "http.server", "--bind", "$(POD_IP)", "8080"], container={
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}))
    p = wait_pod(cluster, runner, namespace, "web", is_ready, "the web pod Ready")
    status = p["status"]
    assert status["phase"] == "Running" and status["hostIP"] == "127.0.0.1"
    assert status["podIP"].startswith(f"127.0.{OCTET}.") and status["podIPs"] == [
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
