"""The watch caches' stores: the instance index the reconcile's selectors go through."""

from __future__ import annotations

from longctx_engine import contract
from longctx_operator.cache import Store

KIND = contract.KIND_BY_NAME["StatefulSet"]


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
