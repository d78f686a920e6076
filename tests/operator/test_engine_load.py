"""What a draining pod holds, from the engine watch's readings (engine_load.py): idle,
and since when at every reading the drain saw."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from longctx_operator.controller import engine_load

NOW = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}"}}


def reading(in_flight, at: datetime.datetime, ready: bool = True) -> engine_load.PodLoad:
    return engine_load.PodLoad(in_flight, ready, at)


def later(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def test_a_pod_is_idle_when_its_ranks_hold_nothing_or_it_is_gone():
    assert reading(0, NOW).idle and not reading(3, NOW).idle
    # A rank that cannot be read: the engine is gone only when the pod is not Ready either.
    assert not reading(None, NOW, ready=True).idle
    assert reading(None, NOW, ready=False).idle


def test_the_tracker_counts_idle_seconds_between_readings_taken_since_its_first_look():
    loads = engine_load.Loads()
    p = pod("d-0")
    loads.publish({"uid-d-0": reading(0, later(-3))})      # read before the drain began
    tracker = engine_load.IdleTracker()
    assert tracker.look([p], NOW, loads) == {}
    loads.publish({"uid-d-0": reading(0, later(1))})
    assert tracker.look([p], later(2), loads) == {"d-0": 0.0}
    loads.publish({"uid-d-0": reading(0, later(6))})
    assert tracker.look([p], later(7), loads) == {"d-0": 5.0}
    loads.publish({"uid-d-0": reading(1, later(11))})  # a request arrives: it starts over
    assert tracker.look([p], later(12), loads) == {}
    loads.publish({"uid-d-0": reading(0, later(16))})
    assert tracker.look([p], later(17), loads) == {"d-0": 0.0}


def test_a_pod_no_longer_looked_at_is_forgotten():
    loads = engine_load.Loads()
    p = pod("d-0")
    tracker = engine_load.IdleTracker()
    tracker.look([p], NOW, loads)
    loads.publish({"uid-d-0": reading(0, later(1))})
    assert tracker.look([p], later(1), loads) == {"d-0": 0.0}
    tracker.look([], later(3), loads)
    loads.publish({"uid-d-0": reading(0, later(6))})
    assert tracker.look([p], later(7), loads) == {}     # its readings before count no more


def test_pods_outside_the_allowed_networks_are_not_contacted(monkeypatch):
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "10.0.0.0/8, fd00::/8")
    assert not engine_load.may_scrape("127.0.0.1")
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "10.0.0.0/8,127.0.0.0/8")
    assert engine_load.may_scrape("127.0.0.1")


def test_a_bad_network_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "127.0.0.0/8,10.0.0.300/8")
    with pytest.raises(ValueError, match="LONGCTX_ENGINE_METRICS_NETWORKS=.*10.0.0.300"):
        engine_load.metrics_networks()
