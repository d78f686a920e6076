"""An operator killed (SIGKILL) at each phase of a rollout converges, once restarted, to what
the state machine says, with never more than two revisions and no duplicates."""

from __future__ import annotations

import threading

import pytest

from longctx_core import contract
from tests.cluster.test_rbac import ServiceAccountOperator
from tests.cluster.test_rollout import rollout_cr, settled_on, status
from tests.cluster.kwok_stages import LOAD_IMAGE, LOAD_IMAGE_2
from tests.conftest import revision_of, wait_for

pytestmark = pytest.mark.cluster


def revisions(cluster, namespace: str) -> dict[str, list[str]]:
    """Revision -> its StatefulSets."""
    out: dict[str, list[str]] = {}
    for sts in cluster.list("statefulsets", namespace, "app.kubernetes.io/instance=glm"):
        out.setdefault(sts["metadata"]["labels"][contract.PAIRING_LABEL], []).append(
            sts["metadata"]["name"])
    return out


@pytest.mark.parametrize("phase", ["Progressing", "Draining"])
def test_an_operator_killed_mid_rollout_resumes_it(cluster, namespace, tmp_path, phase):
    def operator(n: int) -> ServiceAccountOperator:
        return ServiceAccountOperator(cluster.kubeconfig, tmp_path / f"operator-{n}.log",
                                      []).start()

    old, new = rollout_cr(LOAD_IMAGE, drainSeconds=6), rollout_cr(LOAD_IMAGE_2, drainSeconds=6)
    seen: list[dict[str, list[str]]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(revisions(cluster, namespace))
            stop.wait(0.3)

    op = operator(1)
    try:
        assert cluster.apply(old, namespace).returncode == 0
        wait_for(lambda: settled_on(cluster, namespace, old), 90, "the first revision Ready")
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        assert cluster.apply(new, namespace).returncode == 0
        wait_for(lambda: (status(cluster, namespace).get("rollout") or {}).get("phase") == phase,
                 60, f"rollout phase {phase}")
        op.proc.kill()
        op.proc.wait(timeout=10)
        op = operator(2)
        wait_for(lambda: settled_on(cluster, namespace, new), 120, "the rollout finished")
    finally:
        stop.set()
        op.stop()
    assert all(len(r) <= 2 for r in seen), [r for r in seen if len(r) > 2]
    assert all(len(names) == len(set(names)) <= 2 for r in seen for names in r.values())
    final = revisions(cluster, namespace)
    assert final == {revision_of(new): sorted(final[revision_of(new)])} and \
        len(final[revision_of(new)]) == 2, final
    assert status(cluster, namespace)["rollout"]["from"] == revision_of(old)
