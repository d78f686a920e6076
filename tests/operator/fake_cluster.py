"""An in-memory Cluster (controller/cluster.py) for unit tests of the reconcile: objects by
(kind, namespace, name), applies merged over what is there (status kept), label selectors,
status and metadata patches. It plays no controller: a test makes StatefulSets Ready and
pods exist itself (`ready`).

It records every read the operator's watch caches could not serve (`uncached`): a list of
a namespaced kind across all namespaces, which runtime/kube.py sends to the API server; and
counts the reconcile's snapshots (`observed`: its reads of StatefulSets) and its reads of
Deployments, the vllm-router's among them (`deployment_reads`)."""

from __future__ import annotations

import copy
import datetime
from typing import Any, Optional

from longctx_core import contract
from longctx_operator.controller.pods import requested_gpus
from longctx_operator.kinds import Kind

Key = tuple[str, str, str]


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class FakeCluster:
    def __init__(self, nodes: Optional[list[dict[str, Any]]] = None,
                 crds: frozenset[str] = frozenset()):
        self.objects: dict[Key, dict[str, Any]] = {}
        self._nodes = nodes
        self.crds = crds
        self.writes: list[tuple[str, str]] = []     # (verb, "Kind/name")
        self.uncached: list[str] = []               # reads the caches cannot serve
        self.observed = 0                           # lists of the StatefulSets: snapshots
        self.deployment_reads = 0                   # gets and lists of Deployments
        self.created = 0

    # -- the Cluster interface

    def get(self, api_version: str, kind: str, namespace: Optional[str], name: str
            ) -> Optional[dict[str, Any]]:
        obj = self.objects.get((kind, namespace or "", name))
        self._count(kind)
        return copy.deepcopy(obj) if obj is not None else None

    def _count(self, kind: str) -> None:
        self.observed += kind == "StatefulSet"
        self.deployment_reads += kind == "Deployment"

    def list(self, api_version: str, kind: str, namespace: Optional[str],
             label_selector: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
        if namespace is None:
            self.uncached.append(f"list {kind} in all namespaces")
        found = [o for (k, ns, _), o in sorted(self.objects.items())
                 if k == kind and (namespace is None or ns == namespace)
                 and all((o["metadata"].get("labels") or {}).get(lk) == lv
                         for lk, lv in (label_selector or {}).items())]
        self._count(kind)
        return copy.deepcopy(found)

    def apply_all(self, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in manifests:
            key = (m["kind"], m["metadata"].get("namespace", ""), m["metadata"]["name"])
            live = self.objects.get(key)
            obj = copy.deepcopy(m) if live is None else {
                **copy.deepcopy(m), "status": live.get("status", {}),
                "metadata": _merge(live["metadata"], m["metadata"])}
            obj["metadata"].setdefault("uid", f"uid-{key[2]}")
            if live is None:   # in order of creation, as the API server's stamps are
                self.created += 1
                obj["metadata"]["creationTimestamp"] = datetime.datetime.fromtimestamp(
                    self.created, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            obj["metadata"]["generation"] = (live or {}).get("metadata", {}).get(
                "generation", 0) + (live is None or live.get("spec") != m.get("spec"))
            self.objects[key] = obj
            self.writes.append(("apply", f"{key[0]}/{key[2]}"))
            out.append(copy.deepcopy(obj))
        return out

    def delete(self, api_version: str, kind: str, namespace: Optional[str], name: str) -> None:
        self.objects.pop((kind, namespace or "", name), None)
        self.writes.append(("delete", f"{kind}/{name}"))

    def patch_metadata(self, api_version: str, kind: str, namespace: str, name: str,
                       metadata: dict[str, Any]) -> None:
        obj = self.objects[(kind, namespace, name)]
        obj["metadata"] = _merge(obj["metadata"], metadata)
        self.writes.append(("patch", f"{kind}/{name}"))

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str,
                     status: dict[str, Any]) -> None:
        obj = self.objects[(kind, namespace, name)]
        obj["status"] = _merge(obj.get("status") or {}, status)
        self.writes.append(("status", f"{kind}/{name}"))

    def crd_exists(self, name: str) -> bool:
        return name in self.crds

    def nodes(self) -> Optional[list[dict[str, Any]]]:
        return copy.deepcopy(self._nodes)

    def gpus_in_use(self) -> Optional[dict[str, int]]:
        """From every pod held, of any namespace (the operator's GPU-use cache)."""
        if self._nodes is None:
            return None
        out: dict[str, int] = {}
        for (kind, _, _), pod in self.objects.items():
            node = (pod.get("spec") or {}).get("nodeName")
            if kind == "Pod" and node:
                out[node] = out.get(node, 0) + requested_gpus(pod["spec"])
        return out

    # -- what a test plays

    def ready(self, node: str = "node-a") -> None:
        """Every StatefulSet of engines has its pods, on `node`, Ready at its template; the
        router Deployment is available."""
        for (kind, ns, name), sts in list(self.objects.items()):
            if kind == "Deployment":
                sts["status"] = {"observedGeneration": sts["metadata"]["generation"],
                                 "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
            if kind != "StatefulSet":
                continue
            n = sts["spec"]["replicas"]
            sts["status"] = {"replicas": n, "readyReplicas": n, "updatedReplicas": n,
                             "observedGeneration": sts["metadata"]["generation"]}
            for i in range(n):
                labels = dict(sts["spec"]["template"]["metadata"]["labels"])
                labels[contract.POD_INDEX_LABEL] = str(i)
                key = ("Pod", ns, f"{name}-{i}")
                old = self.objects.get(key)
                # What the operator patched onto a pod stays (a scale-down's or a swap's marks).
                kept = (old or {}).get("metadata", {})
                labels.update({k: v for k, v in (kept.get("labels") or {}).items()
                               if k == contract.SERVING_LABEL})
                self.objects[key] = {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": key[2], "namespace": ns, "labels": labels,
                                 "annotations": dict(kept.get("annotations") or {}),
                                 "uid": (old or {}).get("metadata", {}).get("uid", f"uid-{key[2]}"),
                                 "ownerReferences": [{"apiVersion": "apps/v1",
                                                      "kind": "StatefulSet", "name": name,
                                                      "uid": sts["metadata"]["uid"],
                                                      "controller": True}]},
                    "spec": {"nodeName": (old or {}).get("spec", {}).get("nodeName", node),
                             "containers": sts["spec"]["template"]["spec"]["containers"]},
                    "status": {"phase": "Running", "podIP": "198.18.0.9",
                               "conditions": [{"type": "Ready", "status": "True"}]}}
        # Pods of StatefulSets that are gone go too.
        names = {name for (kind, _, name) in self.objects if kind == "StatefulSet"}
        for key in [k for k in self.objects if k[0] == "Pod"]:
            if key[2].rsplit("-", 1)[0] not in names:
                del self.objects[key]
