"""Where the endpoint sends an attempt: through the router (P/D) while a decode pod and a
prefill pod of the serving revision are Ready, else straight to a Ready prefill engine,
which generates on its own (the seed's one-decode shape while its decode pod restarts), and
nowhere while no prefill pod is Ready (the answer waits for one).

The pods come from a watch of the CR's pods through the Kubernetes API (a thread; the
Kubernetes client is synchronous): vllm-router's pods, whose pairing label names the
revision they serve, and the engine pods. Pod IPs, not Services: a Service's address
keeps leading to a router pod for a while after it stopped being Ready.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from longctx_core import contract

log = logging.getLogger(__name__)

PD, PREFILL_ONLY = "pd", "prefill_only"


@dataclass(frozen=True)
class Pod:
    name: str
    component: str
    revision: str
    ip: str
    ready: bool
    serving: bool


def pod_of(obj: dict[str, Any]) -> Optional[Pod]:
    """The facts the endpoint routes on, from a pod object (None: not one it routes to)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    ip = status.get("podIP")
    if not ip or meta.get("deletionTimestamp"):
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    return Pod(meta.get("name", ""), labels.get(contract.COMPONENT_LABEL, ""),
               labels.get(contract.PAIRING_LABEL, ""), ip, ready,
               labels.get(contract.SERVING_LABEL) == "true")


@dataclass(frozen=True)
class Target:
    route: str   # PD or PREFILL_ONLY
    url: str     # scheme://host:port, no path


class Upstreams:
    """The pods of one CR as last seen, and the target of the next attempt.

    `router_url`: a fixed address of the router (llm-d's Gateway); unset, vllm-router's
    Ready pods are dialled on their pod IPs, round robin."""

    def __init__(self, router_url: Optional[str] = None,
                 router_port: int = contract.VLLM_ROUTER_PORT,
                 engine_port: int = contract.SERVING_BASE_PORT):
        self.router_url = router_url
        self.router_port = router_port
        self.engine_port = engine_port
        self._pods: dict[str, Pod] = {}
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self.synced = threading.Event()

    def replace(self, pods: Iterable[Pod]) -> None:
        with self._lock:
            self._pods = {p.name: p for p in pods}
        self.synced.set()

    def update(self, name: str, pod: Optional[Pod]) -> None:
        with self._lock:
            if pod is None:
                self._pods.pop(name, None)
            else:
                self._pods[name] = pod

    def _pods_of(self, component: str) -> list[Pod]:
        with self._lock:
            return sorted((p for p in self._pods.values() if p.component == component),
                          key=lambda p: p.name)

    def _ready(self, component: str) -> list[Pod]:
        return [p for p in self._pods_of(component) if p.ready]

    def _pick(self, pods: list[Pod]) -> Pod:
        return pods[next(self._turn) % len(pods)]

    def target(self) -> Optional[Target]:
        """Where the next attempt goes (None: nowhere yet). Before the pod watch has listed
        the pods (or without one), the router decides alone."""
        revisions: Optional[set[str]] = None   # those the router serves; None: any
        if self.router_url:
            router: Optional[str] = self.router_url
        else:
            # A router pod that is not Ready (vllm-router is not while it has no decode)
            # still names the revision it serves.
            revisions = {p.revision for p in self._pods_of(contract.ROUTER_COMPONENT)} or None
            routers = self._ready(contract.ROUTER_COMPONENT)
            router = (f"http://{self._pick(routers).ip}:{self.router_port}"
                      if routers else None)
        if not self.synced.is_set():
            return Target(PD, router) if router else None

        def serving(role: str) -> list[Pod]:
            return [p for p in self._ready(role) if p.serving
                    and (revisions is None or p.revision in revisions)]
        decodes, prefills = serving("decode"), serving("prefill")
        if not prefills:      # neither P/D nor prefill alone can serve
            return None
        if router and decodes:
            return Target(PD, router)
        return Target(PREFILL_ONLY, f"http://{self._pick(prefills).ip}:{self.engine_port}")


class PodWatch(threading.Thread):
    """Keeps `upstreams` current from a list-then-watch of the CR's pods; relists after a
    failed or expired watch."""

    def __init__(self, upstreams: Upstreams, namespace: str, instance: str):
        super().__init__(name="pod-watch", daemon=True)
        self.upstreams, self.namespace = upstreams, namespace
        self.selector = f"{contract.INSTANCE_LABEL}={instance}"
        self.stopping = threading.Event()

    def run(self) -> None:
        from kubernetes import client, config, watch
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api = client.CoreV1Api()
        while not self.stopping.is_set():
            try:
                listed = api.list_namespaced_pod(self.namespace, label_selector=self.selector)
                pods = [p for p in map(pod_of, api.api_client.sanitize_for_serialization(
                    listed.items)) if p is not None]
                self.upstreams.replace(pods)
                stream = watch.Watch().stream(
                    api.list_namespaced_pod, self.namespace, label_selector=self.selector,
                    resource_version=listed.metadata.resource_version, timeout_seconds=300)
                for event in stream:
                    obj = api.api_client.sanitize_for_serialization(event["object"])
                    name = obj["metadata"]["name"]
                    self.upstreams.update(name, None if event["type"] == "DELETED"
                                          else pod_of(obj))
                    if self.stopping.is_set():
                        return
            except Exception as exc:  # the API server restarting, an expired resourceVersion
                log.warning("pod watch failed (%s); relisting", exc)
                time.sleep(1)
