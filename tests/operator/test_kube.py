"""The operator's API client (kube.Kube) against a scripted HTTP server on 127.0.0.1: which
statuses it retries, which it turns into a result (404 on get, list, delete and patches),
which fail for good as a KubeError naming the object and the server's message, and reads
served from the watch caches without a request."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import kubernetes
import pytest
import urllib3

from longctx_core.contract import FIELD_MANAGER
from longctx_operator import metrics
from longctx_operator.runtime.kube import Kube, KubeError

STS = "/apis/apps/v1/namespaces/llm/statefulsets/glm-decode"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any


class Server:
    """Answers each request with the next scripted (status, body) for its path; 200 with
    the default object when none is left. Records every request."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[int, Any]]] = {}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def handle_one(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server.lock:
                    server.requests.append(Request(
                        self.command, url.path, urllib.parse.parse_qs(url.query),
                        self.headers.get("Content-Type", ""),
                        json.loads(raw) if raw else None))
                    queue = server.script.get(url.path) or []
                    status, body = queue.pop(0) if queue else (200, _obj(url.path))
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_DELETE = do_POST = handle_one

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # A short poll interval: shutdown() waits for one.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,),
                                       daemon=True)

    def answer(self, path: str, *responses: tuple[int, Any]) -> None:
        self.script.setdefault(path, []).extend(responses)

    def paths(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for r in self.requests]


def _obj(path: str, version: str = "7") -> dict[str, Any]:
    return {"metadata": {"namespace": "llm", "name": path.rsplit("/", 1)[-1],
                         "resourceVersion": version}, "items": []}


def status(code: int, message: str, reason: str = "") -> dict[str, Any]:
    return {"kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": message}


def client(url: str, **kw: Any) -> Kube:
    config = kubernetes.client.Configuration()
    config.host = url
    config.retries = False   # one HTTP request per attempt: the retries counted are Kube's
    return Kube(kubernetes.client.ApiClient(config), attempts=3, backoff=0.001, **kw)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def sts_manifest() -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"namespace": "llm", "name": "glm-decode"}, "spec": {"replicas": 2}}


# ---------------------------------------------------------------- retries


@pytest.mark.parametrize("code", [409, 429, 500, 502, 503, 504])
def test_a_retryable_status_is_retried_until_it_succeeds(server, code):
    server.answer(STS, (code, status(code, "busy")), (code, status(code, "busy")))
    out = client(server.url).get("apps/v1", "StatefulSet", "llm", "glm-decode")
    assert out["metadata"]["name"] == "glm-decode"
    assert server.paths() == [("GET", STS)] * 3


def test_a_retryable_status_that_persists_fails_after_the_last_attempt(server):
    server.answer(STS, *[(503, status(503, "etcd leader changed"))] * 5)
    with pytest.raises(KubeError) as err:
        client(server.url).get("apps/v1", "StatefulSet", "llm", "glm-decode")
    assert str(err.value) == "get StatefulSet llm/glm-decode: HTTP 503: etcd leader changed"
    assert len(server.requests) == 3


@pytest.mark.parametrize("code,message", [(400, "bad request"), (422, 'StatefulSet.apps '
                                          '"glm-decode" is invalid: spec.replicas: Invalid')])
def test_an_invalid_apply_fails_at_once_naming_the_object_and_the_servers_message(
        server, code, message):
    server.answer(STS, (code, status(code, message, "Invalid")))
    with pytest.raises(KubeError) as err:
        client(server.url).apply(sts_manifest())
    assert str(err.value) == f"apply StatefulSet llm/glm-decode: HTTP {code}: {message}"
    assert len(server.requests) == 1


def test_forbidden_names_the_missing_permission(server):
    server.answer(STS, (403, status(403, 'statefulsets.apps "glm-decode" is forbidden')))
    with pytest.raises(KubeError, match=r"HTTP 403: statefulsets.apps \"glm-decode\" is "
                                        r"forbidden \(the operator's ServiceAccount lacks"):
        client(server.url).get("apps/v1", "StatefulSet", "llm", "glm-decode")


def test_a_body_that_is_not_json_falls_back_to_the_http_reason(server):
    server.answer(STS, (400, "<html>proxy error</html>"))
    with pytest.raises(KubeError, match=r"^delete StatefulSet llm/glm-decode: HTTP 400: Bad "
                                        r"Request$"):
        client(server.url).delete("apps/v1", "StatefulSet", "llm", "glm-decode")


def test_a_refused_connection_is_not_an_api_error():
    """No server: urllib3's error, which the watch caches relist on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"   # bound, never listening
    with pytest.raises(urllib3.exceptions.HTTPError):
        client(url).get("apps/v1", "StatefulSet", "llm", "glm-decode")


# ---------------------------------------------------------------- 404 as a result


def test_not_found_is_none_on_get_and_empty_on_list(server):
    server.answer(STS, (404, status(404, "not found")))
    collection = "/apis/keda.sh/v1alpha1/namespaces/llm/scaledobjects"
    server.answer(collection, (404, status(404, "the server could not find the resource")))
    kube = client(server.url)
    assert kube.get("apps/v1", "StatefulSet", "llm", "glm-decode") is None
    assert kube.list("keda.sh/v1alpha1", "ScaledObject", "llm") == []   # no CRD


def test_deleting_what_is_gone_succeeds(server):
    server.answer(STS, (404, status(404, "not found")))
    client(server.url).delete("apps/v1", "StatefulSet", "llm", "glm-decode")
    (req,) = server.requests
    assert (req.method, req.body) == ("DELETE", {"propagationPolicy": "Background"})


def test_patching_what_is_gone_is_skipped(server):
    pod = "/api/v1/namespaces/llm/pods/glm-decode-0"
    server.answer(pod, (404, status(404, "not found")))
    server.answer(STS + "/status", (404, status(404, "not found")))
    kube = client(server.url)
    kube.patch_metadata("v1", "Pod", "llm", "glm-decode-0", {"labels": {"a": "b"}})
    kube.patch_status("apps/v1", "StatefulSet", "llm", "glm-decode", {"phase": "Ready"})
    assert [r.content_type for r in server.requests] == ["application/merge-patch+json"] * 2


def test_a_patch_refused_for_good_raises(server):
    server.answer(STS + "/status", (422, status(422, "status.phase: Unsupported value")))
    with pytest.raises(KubeError, match=r"^update status of StatefulSet llm/glm-decode: HTTP "
                                        r"422: status.phase: Unsupported value$"):
        client(server.url).patch_status("apps/v1", "StatefulSet", "llm", "glm-decode", {})


# ---------------------------------------------------------------- what is sent


def test_apply_is_a_forced_server_side_apply_and_remembers_its_own_write(server):
    kube = client(server.url)
    before = metrics.API_WRITES.labels(kind="StatefulSet", verb="apply")._value.get()
    out = kube.apply(sts_manifest())
    (req,) = server.requests
    assert (req.method, req.path, req.content_type) == (
        "PATCH", STS, "application/apply-patch+yaml")
    assert req.query == {"fieldManager": [FIELD_MANAGER], "force": ["true"]}
    assert req.body == sts_manifest()
    assert metrics.API_WRITES.labels(kind="StatefulSet", verb="apply")._value.get() == before + 1
    assert kube.own_write("StatefulSet", out)
    assert not kube.own_write("StatefulSet", _obj(STS, version="8"))


def test_list_sends_the_label_selector(server):
    kube = client(server.url)
    kube.list("v1", "Pod", "llm", {"app.kubernetes.io/instance": "glm", "x": "y"})
    assert server.requests[0].query == {"labelSelector": ["app.kubernetes.io/instance=glm,x=y"]}


def test_apply_all_tries_every_manifest_and_raises_the_first_failure(server):
    bad = "/apis/apps/v1/namespaces/llm/statefulsets/bad"
    server.answer(bad, (422, status(422, "invalid")))
    manifests = [sts_manifest(), {**sts_manifest(), "metadata": {"namespace": "llm",
                                                                 "name": "bad"}}]
    with pytest.raises(KubeError, match="apply StatefulSet llm/bad: HTTP 422: invalid"):
        client(server.url).apply_all(manifests)
    assert sorted(server.paths()) == [("PATCH", bad), ("PATCH", STS)]


def test_a_refused_watch_names_the_status_and_body(server):
    path = "/api/v1/namespaces/llm/pods"
    server.answer(path, (410, status(410, "too old resource version")))
    with pytest.raises(KubeError, match=f"watch {path}: HTTP 410: .*too old resource version"):
        with client(server.url).stream(path, [("watch", "true")], read_timeout=5):
            pass


# ---------------------------------------------------------------- optional reads


def test_a_crd_that_cannot_be_read_counts_as_absent_and_is_asked_again(server):
    """Without the CRD cache (before its first list), each check asks the API server."""
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/scaledobjects.keda.sh"
    server.answer(crd, (403, status(403, "forbidden")), (404, status(404, "not found")))
    kube = client(server.url)
    assert not kube.crd_exists("scaledobjects.keda.sh")
    assert not kube.crd_exists("scaledobjects.keda.sh")
    assert kube.crd_exists("scaledobjects.keda.sh")       # installed since: seen at once
    assert len(server.requests) == 3


def test_nodes_come_from_the_watch_cache_only(server):
    """Without a cache of them (a namespaced install that may not list nodes), none: a
    reconcile never lists them itself."""
    kube = client(server.url)
    assert kube.nodes() is None
    assert server.requests == []


# ---------------------------------------------------------------- through the caches


class FakeStore:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    def select(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [o for (ns, _), o in self.objects.items() if ns == namespace]

    def upsert(self, obj: dict[str, Any]) -> bool:
        self.objects[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return True

    def remove(self, obj: dict[str, Any]) -> bool:
        return self.objects.pop((obj["metadata"]["namespace"], obj["metadata"]["name"]),
                                None) is not None


class FakeCaches:
    def __init__(self) -> None:
        self.statefulsets = FakeStore()

    def store(self, kind: str) -> FakeStore | None:
        return self.statefulsets if kind == "StatefulSet" else None

    def crd_established(self, name: str) -> bool | None:
        return name == "inferencepools.inference.networking.k8s.io"


def test_reads_of_cached_kinds_make_no_request_and_writes_update_the_cache(server):
    caches = FakeCaches()
    kube = client(server.url, caches=caches)
    assert kube.get("apps/v1", "StatefulSet", "llm", "glm-decode") is None
    assert kube.list("apps/v1", "StatefulSet", "llm") == []
    assert kube.crd_exists("inferencepools.inference.networking.k8s.io")
    assert server.requests == []
    kube.apply(sts_manifest())
    assert kube.get("apps/v1", "StatefulSet", "llm", "glm-decode")["metadata"][
        "resourceVersion"] == "7"
    kube.delete("apps/v1", "StatefulSet", "llm", "glm-decode")
    assert kube.get("apps/v1", "StatefulSet", "llm", "glm-decode") is None
    assert server.paths() == [("PATCH", STS), ("DELETE", STS)]
