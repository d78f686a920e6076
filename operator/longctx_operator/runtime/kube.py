"""Kubernetes API access for the operator: get, server-side apply, delete and status
patches for any manifest, with retries on conflicts, throttling and server errors. Reads
of watched kinds come from the watch caches (cache.py) passed in, once those are synced."""

from __future__ import annotations

import json
import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol, TypeVar

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from longctx_core.contract import FIELD_MANAGER
from longctx_operator.kinds import KIND_BY_NAME, Kind

from longctx_operator import metrics
from longctx_operator.controller.cluster import KubeError  # noqa: F401  (raised here)

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRYABLE = {409, 429, 500, 502, 503, 504}
CONNECTIONS = 64   # more than the watch caches' streams plus the concurrent requests
WRITERS = 16       # applies in flight at once, over all reconciles


# The watch caches as this client uses them (cache.Store and cache.Caches). Described here
# rather than imported: cache.py lists and watches through this module.
class CachedStore(Protocol):
    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def select(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]: ...
    def upsert(self, obj: dict[str, Any]) -> bool: ...
    def remove(self, obj: dict[str, Any]) -> bool: ...


class Cache(Protocol):
    def store(self, kind: str) -> CachedStore | None: ...
    def crd_established(self, name: str) -> bool | None: ...
    def nodes(self) -> list[dict[str, Any]] | None: ...
    def gpus_in_use(self) -> dict[str, int] | None: ...


def collection_path(kind: Kind, namespace: str | None) -> str:
    base = f"/api/{kind.api_version}" if "/" not in kind.api_version else \
        f"/apis/{kind.api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{kind.plural}"


def _path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    tail = f"/{name}" if name else ""
    return collection_path(KIND_BY_NAME[kind], namespace) + tail


class Kube:
    """A thin, retrying REST client over kubernetes.client.ApiClient."""

    def __init__(self, api_client: kubernetes.client.ApiClient | None = None,
                 attempts: int = 5, backoff: float = 0.2, caches: Cache | None = None):
        self.api = api_client or kubernetes.client.ApiClient()
        self.attempts = attempts
        self.backoff = backoff
        self.caches = caches
        # The resourceVersion of each object's last write by this operator: the watch event
        # carrying that version echoes the write and tells the reconcile nothing new.
        self._written: dict[tuple[str, str, str], str] = {}
        self._writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="apply")

    @classmethod
    def from_environment(cls) -> "Kube":
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            # Read KUBECONFIG now: the client captures it once, at import time.
            kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        config = kubernetes.client.Configuration.get_default_copy()
        # Each watch cache holds a connection for its stream and each reconcile worker one
        # for its requests; from a full pool a connection is discarded after use, and every
        # later request pays a new TLS handshake.
        config.connection_pool_maxsize = CONNECTIONS
        # The loaders' token refresh hook sets the host again before every request, and
        # each time the client reads the proxy from the whole environment anew (near a
        # tenth of a request's CPU): read it once.
        config.proxy = config.proxy
        return cls(kubernetes.client.ApiClient(config))

    # -- low level

    def _call(self, method: str, path: str, body: Any = None, query: list | None = None,
              content_type: str = "application/json") -> Any:
        def once() -> Any:
            _, url, headers, _, _ = self.api.param_serialize(
                method, path, query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                auth_settings=["BearerToken"])
            # The client serialises dicts only for JSON content types; an apply patch is YAML,
            # and JSON is YAML, so it goes out as a JSON string.
            payload = body if body is None or "json" in content_type else json.dumps(body)
            response = self.api.call_api(method, url, header_params=headers, body=payload,
                                         _request_timeout=30)
            response.read()
            if not 200 <= response.status < 300:
                raise ApiException(http_resp=response)
            return json.loads(response.data) if response.data else None

        return self.retry(once, f"{method} {path}")

    def retry(self, fn: Callable[[], T], what: str) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except ApiException as exc:
                if exc.status not in RETRYABLE or attempt == self.attempts:
                    raise
                delay = self.backoff * 2 ** (attempt - 1) * (1 + random.random())
                log.info("%s: HTTP %s, retrying in %.2f s", what, exc.status, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    @contextmanager
    def stream(self, path: str, query: list, read_timeout: float,
               accept: str = "application/json") -> Iterator[Any]:
        """A streamed GET (a watch): yields the response, whose iteration gives lines."""
        _, url, headers, _, _ = self.api.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": accept},
            auth_settings=["BearerToken"])
        response = self.api.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=read_timeout))
        try:
            if response.status != 200:
                raise KubeError(f"watch {path}: HTTP {response.status}: "
                                f"{response.read().decode(errors='replace')[:300]}")
            yield response
        finally:
            response.release_conn()

    def list_raw(self, kind: Kind, namespace: str | None, label_selector: str) -> dict[str, Any]:
        """A LIST's whole body (items and the list's resourceVersion)."""
        try:
            return self._call("GET", collection_path(kind, namespace),
                              query=[("labelSelector", label_selector)])
        except ApiException as exc:
            raise KubeError(describe(exc, f"list {kind.kind} in {namespace or 'all namespaces'}")
                            ) from exc

    def _cached(self, kind: str, namespace: str | None):
        return self.caches.store(kind) if self.caches is not None and namespace else None

    # -- objects

    def get(self, api_version: str, kind: str, namespace: str | None, name: str
            ) -> dict[str, Any] | None:
        store = self._cached(kind, namespace)
        if store is not None:
            return store.get(namespace or "", name)
        try:
            return self._call("GET", _path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeError(describe(exc, f"get {kind} {namespace}/{name}")) from exc

    def list(self, api_version: str, kind: str, namespace: str | None,
             label_selector: dict[str, str] | None = None) -> list[dict[str, Any]]:
        store = self._cached(kind, namespace)
        if store is not None:
            return store.select(namespace or "", label_selector or {})
        query = []
        if label_selector:
            query.append(("labelSelector", ",".join(f"{k}={v}" for k, v in label_selector.items())))
        try:
            return self._call("GET", _path(api_version, kind, namespace), query=query)["items"]
        except ApiException as exc:
            if exc.status == 404:
                return []  # the kind's CRD is not installed
            raise KubeError(describe(exc, f"list {kind} in {namespace}")) from exc

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply with the operator's one field manager (takes fields over)."""
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
        try:
            out = self._call("PATCH", path, body=manifest,
                             query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                             content_type="application/apply-patch+yaml")
        except ApiException as exc:
            raise KubeError(describe(exc, f"apply {manifest['kind']} "
                                          f"{meta.get('namespace')}/{meta['name']}")) from exc
        metrics.API_WRITES.labels(kind=manifest["kind"], verb="apply").inc()
        self._wrote(manifest["kind"], out)
        return out

    def apply_all(self, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Applies the manifests at once (they must not depend on each other's order): a
        reconcile then waits about one write's latency, not the sum of its writes. Every
        apply is tried; the first failure is raised once all are done. Returns the objects
        as the API server answered."""
        futures = [self._writers.submit(self.apply, m) for m in manifests]
        errors = [f.exception() for f in futures]
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            raise failed
        return [f.result() for f in futures]

    def _wrote(self, kind: str, out: dict[str, Any] | None) -> None:
        """Keeps a written object's new version: in the cache, since the next reconcile must
        not act on a lagging one, and as this operator's own write."""
        if not out:
            return
        meta = out["metadata"]
        self._written[(kind, meta.get("namespace", ""), meta["name"])] = meta["resourceVersion"]
        store = self._cached(kind, meta.get("namespace"))
        if store is not None:
            store.upsert(out)

    def own_write(self, kind: str, obj: dict[str, Any]) -> bool:
        """Whether `obj` (from a watch event) is exactly this operator's last write of it."""
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        return version is not None and self._written.get(
            (kind, meta.get("namespace", ""), meta.get("name", ""))) == version

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        try:
            self._call("DELETE", _path(api_version, kind, namespace, name),
                       body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status != 404:
                raise KubeError(describe(exc, f"delete {kind} {namespace}/{name}")) from exc
        metrics.API_WRITES.labels(kind=kind, verb="delete").inc()
        self._written.pop((kind, namespace or "", name), None)
        store = self._cached(kind, namespace)
        if store is not None:
            store.remove({"metadata": {"namespace": namespace, "name": name}})

    def patch_metadata(self, api_version: str, kind: str, namespace: str, name: str,
                       metadata: dict[str, Any]) -> None:
        """A merge patch of labels and annotations (null removes a key)."""
        path = _path(api_version, kind, namespace, name)
        try:
            out = self._call("PATCH", path, body={"metadata": metadata},
                             content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status == 404:
                return
            raise KubeError(describe(exc, f"patch {kind} {namespace}/{name}")) from exc
        metrics.API_WRITES.labels(kind=kind, verb="patch").inc()
        self._wrote(kind, out)

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str,
                     status: dict[str, Any]) -> None:
        path = _path(api_version, kind, namespace, name) + "/status"
        try:
            out = self._call("PATCH", path, body={"status": status},
                             content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted meanwhile
            raise KubeError(describe(exc, f"update status of {kind} {namespace}/{name}")) from exc
        metrics.API_WRITES.labels(kind=kind, verb="status").inc()
        self._wrote(kind, out)

    def crd_exists(self, name: str) -> bool:
        """Whether a CRD is installed and established, from the CRD cache; until that cache
        has listed (the startup waits for it), asked of the API server each time."""
        cached = self.caches.crd_established(name) if self.caches is not None else None
        if cached is not None:
            return cached
        try:
            return self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", None,
                            name) is not None
        except KubeError:
            return False  # no permission to read CRDs: treat the optional kind as absent


    def nodes(self) -> list[dict[str, Any]] | None:
        """The cluster's Nodes, from the watch cache; None until it has listed them, or when
        the operator may not list them (a namespaced install without cluster reads): the
        planner then skips its host-memory check and says so. Never a request of its own."""
        return self.caches.nodes() if self.caches is not None else None

    def gpus_in_use(self) -> dict[str, int] | None:
        """The GPUs the pods of every namespace request on each node, from the GPU-use
        cache (cache.GpuUse); None until it has listed them, or when the operator may not
        list the pods of every namespace. Never a request of its own."""
        return self.caches.gpus_in_use() if self.caches is not None else None


def describe(exc: ApiException, what: str) -> str:
    """A one-line error: what failed, the HTTP status and the API server's message."""
    message = exc.reason
    try:
        message = json.loads(exc.body).get("message", message)
    except (TypeError, ValueError):
        pass
    hint = ""
    if exc.status == 403:
        hint = " (the operator's ServiceAccount lacks this permission: check the chart's RBAC)"
    return f"{what}: HTTP {exc.status}: {message}{hint}"
