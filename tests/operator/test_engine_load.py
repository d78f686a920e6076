"""Reading a draining pod's requests from its engines' /metrics (engine_load.py), against
real HTTP servers on 127.0.0.1 that serve vLLM's metric page."""

from __future__ import annotations

import datetime
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from longctx_operator.controller import engine_load

NOW = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)


def vllm_page(running: float, waiting: float) -> str:
    """The lines vLLM 0.32 exports for its scheduler, around others it also exports."""
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny-mla"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny-mla"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny-mla"}} 0.25
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny-mla"}} 7.0
"""


class Engine:
    """One engine rank's /metrics, with the counts a test sets."""

    def __init__(self) -> None:
        self.running, self.waiting = 0.0, 0.0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = vllm_page(engine.running, engine.waiting).encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def ranks() -> Iterator[list[Engine]]:
    engines = [Engine(), Engine()]
    yield engines
    for e in engines:
        e.server.shutdown()
        e.server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod(name: str, ports: list[int], ready: bool = True) -> dict[str, Any]:
    """An engine pod as builders/engine.py names its ports (vllm-<rank>, nixl-<rank>)."""
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "engine", "ports": [
                *({"name": f"vllm-{i}", "containerPort": p} for i, p in enumerate(ports)),
                {"name": "nixl-0", "containerPort": closed_port()}]}]},
            "status": {"podIP": "127.0.0.1", "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}}


def test_running_and_waiting_requests_of_every_rank_are_summed(ranks):
    ranks[0].running, ranks[1].waiting = 2, 1
    assert engine_load.pod_in_flight(pod("d-0", [r.port for r in ranks])) == 3
    assert not engine_load.pod_idle(pod("d-0", [r.port for r in ranks]))
    ranks[0].running, ranks[1].waiting = 0, 0
    assert engine_load.pod_idle(pod("d-0", [r.port for r in ranks]))


def test_the_other_metrics_of_the_page_count_for_nothing():
    assert engine_load.in_flight(vllm_page(0, 0)) == 0
    assert engine_load.in_flight(vllm_page(1, 4)) == 5


def test_a_pod_that_cannot_be_read_is_idle_only_when_not_ready(ranks):
    gone = [ranks[0].port, closed_port()]     # one rank answers, the other is gone
    assert engine_load.pod_in_flight(pod("d-0", gone)) is None
    assert not engine_load.pod_idle(pod("d-0", gone, ready=True))
    assert engine_load.pod_idle(pod("d-0", gone, ready=False))
    no_ip = pod("d-1", [ranks[0].port], ready=False)
    del no_ip["status"]["podIP"]
    assert engine_load.pod_idle(no_ip)


def test_the_tracker_counts_idle_seconds_from_the_first_idle_look(ranks):
    tracker = engine_load.IdleTracker()
    p = pod("d-0", [ranks[0].port])
    assert tracker.look([p], NOW) == {"d-0": 0.0}
    assert tracker.look([p], NOW + datetime.timedelta(seconds=6)) == {"d-0": 6.0}
    ranks[0].running = 1       # a request arrives: the pod is busy, the count starts over
    assert tracker.look([p], NOW + datetime.timedelta(seconds=7)) == {}
    ranks[0].running = 0
    assert tracker.look([p], NOW + datetime.timedelta(seconds=9)) == {"d-0": 0.0}


def test_a_pod_no_longer_looked_at_is_forgotten(ranks):
    tracker = engine_load.IdleTracker()
    p = pod("d-0", [ranks[0].port])
    tracker.look([p], NOW)
    tracker.look([], NOW + datetime.timedelta(seconds=3))
    assert tracker.look([p], NOW + datetime.timedelta(seconds=10)) == {"d-0": 0.0}


def test_pods_outside_the_allowed_networks_are_not_contacted(ranks, monkeypatch):
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "10.0.0.0/8, fd00::/8")
    assert engine_load.pod_in_flight(pod("d-0", [ranks[0].port])) is None
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "10.0.0.0/8,127.0.0.0/8")
    assert engine_load.pod_in_flight(pod("d-0", [ranks[0].port])) == 0


def test_a_bad_network_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "127.0.0.0/8,10.0.0.300/8")
    with pytest.raises(ValueError, match="LONGCTX_ENGINE_METRICS_NETWORKS=.*10.0.0.300"):
        engine_load.metrics_networks()
