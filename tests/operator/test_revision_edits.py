"""An edit of a field the NIXL handshake depends on (model.name, engine.kvCacheDtype,
engine.speculative.method) is a new revision: new StatefulSets beside the serving ones and a
rollout under spec.rollout, never an in-place change that would pair old and new pods."""

from __future__ import annotations

import copy
import datetime

import pytest

from longctx_core import contract
from longctx_core.api.spec import load_spec
from longctx_core.plan.roles import serving_plan
from longctx_operator.controller.routers import router_for
from longctx_operator.controller import rollout
from longctx_operator.controller.builders.engine import revision_objects
from tests.conftest import example_cr
from tests.contract.variants import deep_merge

NOW = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
EDITS = [{"model": {"name": "zai-org/GLM-5.3-FP8-v2"}},
         {"engine": {"kvCacheDtype": "fp8_ds_mla"}},
         {"engine": {"speculative": {"method": "none"}}}]


def _serving_revision(rev: str) -> dict[str, rollout.Revision]:
    labels = {role: {contract.PAIRING_LABEL: rev, contract.COMPONENT_LABEL: role}
              for role in contract.ROLES}
    stss = [{"metadata": {"name": f"glm-{r}-{rev}", "labels": labels[r]},
             "status": {"readyReplicas": 1}} for r in contract.ROLES]
    pods = [{"metadata": {"name": f"glm-{r}-{rev}-0", "labels": labels[r]}, "status": {}}
            for r in contract.ROLES]
    return rollout.group_revisions(stss, pods)


@pytest.mark.parametrize("edit", EDITS, ids=lambda e: str(e))
@pytest.mark.parametrize("strategy", ["Surge", "Recreate"])
def test_an_edit_of_a_handshake_field_starts_a_revisioned_rollout(edit, strategy):
    cr = example_cr("glm")
    cr["metadata"].update(namespace="default", uid="u1")
    deep_merge(cr["spec"], {"rollout": {"strategy": strategy}})
    old = serving_plan(load_spec(cr["spec"]))
    edited = copy.deepcopy(cr)
    deep_merge(edited["spec"], edit)
    new = serving_plan(load_spec(edited["spec"]))
    assert new.revision != old.revision
    names = {o["metadata"]["name"] for o in revision_objects(edited, new, router_for(new.spec))
             if o["kind"] == "StatefulSet"}
    assert names == {f"glm-{role}-{new.revision}" for role in contract.ROLES}
    policy = rollout.Policy(strategy=strategy, min_ready={"prefill": 1, "decode": 1},
                            drain_seconds=60.0, ready_timeout_seconds=600.0, downtime="9 min")
    step = rollout.step(desired=new.revision, serving=old.revision,
                        revisions=_serving_revision(old.revision), previous={}, policy=policy,
                        now=NOW, capacity_shortage=lambda: None)
    # The old revision keeps serving (Surge) or is stopped first (Recreate): a rollout, with
    # the status naming both revisions.
    assert step.phase == (rollout.PROGRESSING if strategy == "Surge" else rollout.RECREATING)
    assert step.status["from"] == old.revision and step.status["to"] == new.revision
