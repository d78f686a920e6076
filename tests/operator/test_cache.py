"""The watch caches' stores: the instance index the reconcile's selectors go through, and
the GPUs in use on each node."""

from __future__ import annotations

import contextlib
import json
import threading

from longctx_core import contract
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.runtime.cache import GpuUse, Reflector, Store
from longctx_operator.controller.desired import desired_objects
from longctx_operator.controller.drift import matches
from longctx_operator import kinds
from tests.contract.variants import spec_with

KIND = kinds.KIND_BY_NAME["StatefulSet"]


def obj(name: str, instance: str | None, namespace: str = "ns", version: str = "1",
        **labels: str) -> dict:
    if instance is not None:
        labels[contract.INSTANCE_LABEL] = instance
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version,
                         "labels": labels, "managedFields": [{"manager": "x"}]}}


def names(objects: list[dict]) -> set[str]:
    return {o["metadata"]["name"] for o in objects}


def test_select_by_instance_uses_only_that_crs_objects_and_the_other_labels():
    store = Store(KIND, (None,))
    store.replace(None, [obj("a-prefill", "a", role="prefill"), obj("a-decode", "a", role="decode"),
                         obj("b-prefill", "b", role="prefill"),
                         obj("a-prefill", "a", namespace="other")])
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "a"})) == {"a-prefill", "a-decode"}
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "a", "role": "decode"})) == {
        "a-decode"}
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "c"})) == set()
    assert names(store.select("ns", {"role": "prefill"})) == {"a-prefill", "b-prefill"}
    assert store.get("ns", "a-prefill")["metadata"].get("managedFields") is None


def test_a_listed_crd_is_kept_without_its_schema():
    """A list's items carry no kind: the store's kind decides what is kept. Every reconcile
    asks whether a CRD is established, so a CRD kept whole (its OpenAPI schema, hundreds
    of kB for some) was decoded again and again."""
    store = Store(kinds.KIND_BY_NAME["CustomResourceDefinition"], (None,))
    crd = {"metadata": {"name": "podmonitors.monitoring.coreos.com", "resourceVersion": "7"},
           "spec": {"versions": [{"schema": {"openAPIV3Schema": {"description": "x" * 10_000}}}]},
           "status": {"conditions": [{"type": "Established", "status": "True",
                                      "message": "the initial names have been accepted"}]}}
    store.replace(None, [crd])
    kept = store.get("", "podmonitors.monitoring.coreos.com")
    assert kept == {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                    "metadata": {
        "name": "podmonitors.monitoring.coreos.com", "resourceVersion": "7"},
        "status": {"conditions": [{"type": "Established", "status": "True"}]}}


def test_a_relisted_child_matches_what_the_operator_applied():
    """A list's items carry no apiVersion or kind. Stored without them, every child read
    back after a relist differed from its desired object in apiVersion, so each reconcile
    re-applied all of them (no-op applies, which keep the resourceVersion and so never
    replaced the stored copy) until something else changed them."""
    cr = {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
          "metadata": {"name": "glm", "namespace": "llm", "uid": "u-1"}}
    plan = serving_plan(spec_with())
    desired = desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=False)
    stores = {k.kind: Store(k, (None,)) for k in kinds.CACHED_KINDS}
    for kind, store in stores.items():
        items = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")}
                 for o in desired if o["kind"] == kind]
        store.replace(None, [{**o, "metadata": {**o["metadata"], "resourceVersion": "5"}}
                             for o in items])
    for o in desired:
        live = stores[o["kind"]].get("llm", o["metadata"]["name"])
        assert live is not None and matches(o, live), f"{o['kind']}/{o['metadata']['name']}"
    assert len(desired) >= 12


def test_a_relabelled_object_moves_between_instances_and_a_removed_one_leaves():
    store = Store(KIND, (None,))
    store.replace(None, [obj("x", "a")])
    store.upsert(obj("x", "b", version="2"))
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "a"})) == set()
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "b"})) == {"x"}
    store.upsert(obj("x", "a", version="1"))   # an older version is ignored
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "b"})) == {"x"}
    store.remove(obj("x", "b", version="3"))
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "b"})) == set() and len(store) == 0


def test_a_relist_of_one_namespace_replaces_only_that_namespace():
    store = Store(KIND, ("ns", "other"))
    store.replace("ns", [obj("gone", "a"), obj("kept", "a")])
    store.replace("other", [obj("there", "a", namespace="other")])
    assert store.synced.is_set()
    store.replace("ns", [obj("kept", "a", version="5")])
    assert names(store.select("ns", {contract.INSTANCE_LABEL: "a"})) == {"kept"}
    assert names(store.select("other", {contract.INSTANCE_LABEL: "a"})) == {"there"}


def test_a_store_is_synced_only_when_every_scope_is_listed():
    store = Store(KIND, ("ns", "other"))
    store.replace("ns", [])
    assert not store.synced.is_set()
    store.replace("other", [])
    assert store.synced.is_set()


def test_a_late_update_of_a_deleted_object_does_not_bring_it_back():
    store = Store(KIND, (None,))
    store.replace(None, [obj("pod", "a", version="5")])
    store.remove(obj("pod", "a", version="7"))       # one watch: the deletion
    store.upsert(obj("pod", "a", version="6"))       # the other: the update before it
    assert store.get("ns", "pod") is None and len(store) == 0
    store.upsert(obj("pod", "a", version="9"))       # created again under the same name
    assert store.get("ns", "pod")["metadata"]["resourceVersion"] == "9"


def test_a_late_deletion_of_an_earlier_object_keeps_the_one_created_since():
    store = Store(KIND, (None,))
    store.upsert(obj("pod", "a", version="9"))
    store.remove(obj("pod", "a", version="7"))
    assert store.get("ns", "pod")["metadata"]["resourceVersion"] == "9"


def test_what_a_relist_lacks_counts_as_deleted_at_the_lists_version():
    store = Store(KIND, (None,))
    store.replace(None, [obj("pod", "a", version="5")])
    store.replace(None, [], version="8")
    store.upsert(obj("pod", "a", version="6"))       # an event from before the list
    assert store.get("ns", "pod") is None
    store.upsert(obj("pod", "a", version="10"))
    assert store.get("ns", "pod") is not None


def test_a_relist_returns_what_was_added_changed_or_removed():
    store = Store(KIND, (None,))
    store.replace(None, [obj("same", "a", version="1"), obj("moved", "a", version="1"),
                         obj("gone", "b", version="1")])
    changed = store.replace(None, [obj("same", "a", version="1"), obj("moved", "a", version="4"),
                                   obj("new", "c", version="5")], version="6")
    assert {c["metadata"]["name"]: c["metadata"]["labels"][contract.INSTANCE_LABEL]
            for c in changed} == {"moved": "a", "new": "c", "gone": "b"}


def test_upsert_and_remove_say_whether_the_store_changed():
    store = Store(KIND, (None,))
    assert store.upsert(obj("x", "a", version="2"))
    assert not store.upsert(obj("x", "a", version="2"))    # the operator's own write, echoed
    assert not store.upsert(obj("x", "a", version="1"))
    assert not store.remove(obj("x", "a", version="1"))    # an older object's deletion
    assert store.remove(obj("x", "a", version="3"))
    assert not store.remove(obj("x", "a", version="4"))    # already gone


class ScriptedKube:
    """Lists and watch streams from a script: each list returns the next body, each watch
    yields the next list of events and ends (the reflector then resumes or relists)."""

    def __init__(self, lists: list[list[dict]], watches: list[list[dict]]):
        self.lists, self.watches = lists, watches
        self.over = threading.Event()   # set when the script is played: the reflector stops

    def list_raw(self, kind, namespace, selector):
        items = self.lists.pop(0)
        return {"metadata": {"resourceVersion": "10"}, "items": items}

    @contextlib.contextmanager
    def stream(self, path, query, timeout, accept="application/json"):
        if not self.watches:
            self.over.set()
            raise OSError("the script is over")
        yield [json.dumps(e).encode() for e in self.watches.pop(0)]


def test_a_reflector_tells_of_watch_changes_and_of_what_a_later_relist_finds():
    kube = ScriptedKube(
        lists=[[obj("a-sts", "a", version="5")],                      # the starting state
               [obj("b-sts", "b", version="9")]],                         # after the 410
        watches=[[{"type": "MODIFIED", "object": obj("a-sts", "a", version="6")},
                  {"type": "MODIFIED", "object": obj("a-sts", "a", version="6")},  # again
                  {"type": "DELETED", "object": obj("a-sts", "a", version="7")},
                  {"type": "ERROR", "object": {"code": 410}}]])          # expired: relist
    heard: list[tuple[str, str]] = []
    store = Store(KIND, (None,))
    reflector = Reflector(kube, store, None, "", changed=lambda kind, o: heard.append(
        (o["metadata"]["name"], o["metadata"]["resourceVersion"])))
    reflector.stopping = kube.over
    reflector.start()
    reflector.join(timeout=5)
    assert heard == [("a-sts", "6"), ("a-sts", "7"), ("b-sts", "9")]
    assert store.get("ns", "a-sts") is None and store.get("ns", "b-sts") is not None


def gpu_pod(name: str, node: str | None, gpus: int, phase: str = "Running",
            namespace: str = "team") -> dict:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {**({"nodeName": node} if node else {}), "containers": [
                {"name": "c", "resources": {"requests": {contract.GPU_RESOURCE: str(gpus)}}},
                {"name": "sidecar", "resources": {}}]},
            "status": {"phase": phase}}


def test_gpu_use_counts_what_bound_pods_of_every_namespace_request_until_they_finish():
    use = GpuUse()
    assert not use.synced.is_set()
    use.replace(None, [gpu_pod("a", "n1", 8), gpu_pod("b", "n1", 4, namespace="other"),
                       gpu_pod("pending", None, 8), gpu_pod("cpu", "n2", 0),
                       gpu_pod("done", "n2", 8, phase="Succeeded")])
    assert use.synced.is_set() and use.by_node() == {"n1": 12}
    assert use.upsert(gpu_pod("pending", "n2", 8))        # bound by the scheduler
    assert use.upsert(gpu_pod("a", "n1", 8, phase="Failed"))   # finished: its GPUs free
    assert use.by_node() == {"n1": 4, "n2": 8}
    assert use.remove(gpu_pod("b", "n1", 4, namespace="other"))
    assert not use.remove(gpu_pod("cpu", "n2", 0))        # never held
    assert use.by_node() == {"n2": 8}


def test_a_change_of_only_a_status_no_reconcile_reads_is_stored_and_is_no_news():
    """A PodDisruptionBudget's status is the disruption controller's, and no reconcile
    reads it: its updates must not each ask for a reconcile. Its spec or labels changing
    does; a StatefulSet's status changing (its readiness) does."""
    pdb = Store(kinds.KIND_BY_NAME["PodDisruptionBudget"], (None,))
    first = {**obj("a-prefill", "a", version="1"), "spec": {"minAvailable": 1}}
    assert pdb.upsert(first)
    status_only = {**first, "metadata": {**first["metadata"], "resourceVersion": "2"},
                   "status": {"disruptionsAllowed": 0, "currentHealthy": 1}}
    assert not pdb.upsert(status_only)
    assert pdb.get("ns", "a-prefill")["status"]["currentHealthy"] == 1
    spec_edit = {**status_only, "metadata": {**status_only["metadata"], "resourceVersion": "3"},
                 "spec": {"minAvailable": 0}}
    assert pdb.upsert(spec_edit)
    relabelled = {**spec_edit, "metadata": {**spec_edit["metadata"], "resourceVersion": "4",
                                            "labels": {"x": "y"}}}
    assert pdb.upsert(relabelled)

    sts = Store(KIND, (None,))
    assert sts.upsert({**obj("a-decode", "a", version="1"), "spec": {"replicas": 1}})
    assert sts.upsert({**obj("a-decode", "a", version="2"), "spec": {"replicas": 1},
                       "status": {"readyReplicas": 1}})
