"""The engine watch reads real HTTP metrics pages (a server on loopback serving vLLM's
exposition text) and records only counters that grew after a pod's first read."""

from __future__ import annotations

import http.server
import threading

import pytest

from longctx_operator.controller import data_path
from longctx_operator.runtime import engine_watch

PAGE = """# HELP vllm:nixl_num_failed_transfers Number of failed NIXL KV Cache transfers.
# TYPE vllm:nixl_num_failed_transfers counter
vllm:nixl_num_failed_transfers_total{{engine="0",model_name="m"}} {failed}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


@pytest.fixture
def engine():
    state = {"failed": 0.0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = PAGE.format(failed=state["failed"]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, server.server_address[1]
    server.shutdown()


def engine_pod(port: int, restarts: int = 0, started: str = "2026-01-01T00:00:00Z") -> dict:
    return {"metadata": {"name": "cr-decode-0", "namespace": "ns", "uid": "u",
                         "labels": {"app.kubernetes.io/instance": "cr",
                                    "app.kubernetes.io/component": "decode"}},
            "spec": {"containers": [{"ports": [{"name": "vllm-0", "containerPort": port}]}]},
            "status": {"podIP": "127.0.0.1", "containerStatuses": [{"restartCount": restarts, "state": {
                           "running": {"startedAt": started}}}],
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_growth_after_the_first_read_is_a_fault(engine, monkeypatch):
    monkeypatch.setenv("LONGCTX_ENGINE_METRICS_NETWORKS", "127.0.0.0/8")
    state, port = engine
    seen: list[tuple[str, str]] = []
    pods = [engine_pod(port)]
    watch = engine_watch.EngineWatch(lambda: pods, lambda ns, name: seen.append((ns, name)),
                                     period=60)
    state["failed"] = 3.0
    assert watch.look() == []            # the first read is the baseline
    state["failed"] = 4.0
    (growth,) = watch.look()
    assert growth.metric == "vllm:nixl_num_failed_transfers_total" and growth.grew_by == 1
    assert seen == [("ns", "cr")]
    assert data_path.RECORDED.recent(("ns", "cr"), growth.at)[-1] == growth
    # A restarted engine starts its counters anew, from zero: its first failure is a fault.
    pods[0] = engine_pod(port, restarts=1, started="2999-01-01T00:00:00Z")
    state["failed"] = 1.0
    (growth,) = watch.look()
    assert growth.grew_by == 1


def test_a_pod_outside_the_allowed_networks_is_never_read(engine, monkeypatch):
    monkeypatch.setenv("LONGCTX_ENGINE_METRICS_NETWORKS", "198.18.0.0/15")
    _, port = engine
    assert engine_watch.read_pod(engine_pod(port)) is None
