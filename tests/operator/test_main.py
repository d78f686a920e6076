"""The Controller behind Kopf's handlers: every failure of a reconcile is retried with
back-off and reported; a success resets the back-off and queues the wake-up it asked for."""

from __future__ import annotations

import time

import pytest

from longctx_core import contract
from longctx_operator.controller.reconcile import Outcome
from longctx_operator.runtime import main
from longctx_operator.runtime.kube import KubeError

KEY = ("ns", "glm")


class OneCR:
    """A reading client holding one CR."""

    def get(self, api_version, kind, namespace, name):
        assert (kind, namespace, name) == (contract.KIND, *KEY)
        return {"metadata": {"name": name, "namespace": namespace}}


@pytest.fixture
def controller(monkeypatch):
    events = []
    monkeypatch.setattr(main.kopf, "event", lambda cr, **kw: events.append(kw))
    c = main.Controller(OneCR(), caches=None, workers=1)
    c.queue.first_retry = 60   # nothing reruns during a test
    c.events = events
    yield c
    c.queue.stop()


def run_once(controller, monkeypatch, result) -> None:
    def reconcile(kube, cr, memory):
        if isinstance(result, Exception):
            raise result
        return result
    monkeypatch.setattr(main, "reconcile", reconcile)
    controller._reconcile(KEY)


@pytest.mark.parametrize("failure", [KubeError("apply StatefulSet x: Conflict"),
                                     ValueError("a bug"), KeyError("status")])
def test_any_failure_is_retried_with_back_off_and_reported(controller, monkeypatch, failure):
    run_once(controller, monkeypatch, failure)
    first = controller.queue.pending()[KEY]
    assert 55 < first <= 60
    run_once(controller, monkeypatch, failure)
    first_event, second_event = controller.events
    assert first_event["type"] == "Warning" and first_event["reason"] == "ReconcileFailed"
    assert "retrying in 60 s" in first_event["message"]
    # Failed again before its retry came (an event ran it): the same retry stands.
    assert "retrying in 60 s" in second_event["message"]
    assert str(failure.args[0]) in first_event["message"]


def test_a_success_resets_the_back_off_and_queues_its_wake_up(controller, monkeypatch):
    run_once(controller, monkeypatch, ValueError("once"))
    outcome = Outcome(phase="Ready", wake_after=30.0,
                      events=[("Normal", "Ready", "serving")])
    run_once(controller, monkeypatch, outcome)
    assert 25 < controller.queue.pending()[KEY] <= 30   # the wake-up, earlier than the retry
    assert controller.phases[KEY] == "Ready"
    assert controller.queue.retry(KEY) == 60            # the back-off starts over
    assert controller.events[-1] == {"type": "Normal", "reason": "Ready", "message": "serving"}


def test_a_deleted_cr_is_forgotten(controller, monkeypatch):
    monkeypatch.setattr(OneCR, "get", lambda self, *a: None)
    controller.phases[KEY] = "Ready"
    controller._reconcile(KEY)
    assert KEY not in controller.phases and not controller.events
