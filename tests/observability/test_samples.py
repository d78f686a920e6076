"""The sample recorder and the promtool input it makes (tests/observability/samples.py)."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Iterator

import pytest

from tests.observability import samples

PAGE = """# HELP vllm:nixl_num_failed_transfers Number of failed NIXL KV Cache transfers.
# TYPE vllm:nixl_num_failed_transfers counter
vllm:nixl_num_failed_transfers_total{engine="0",model_name="mla"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="mla"} 0.0
"""


@pytest.fixture
def server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = PAGE.encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join()


def test_record_saves_the_page_and_load_reads_it_back(server, tmp_path, monkeypatch):
    monkeypatch.setattr(samples, "SAMPLES", tmp_path)
    path = samples.record("decode-test", server + "/metrics")
    assert path == tmp_path / "decode-test.prom" and path.read_text() == PAGE
    assert samples.load("decode-test") == {
        'vllm:nixl_num_failed_transfers_total{engine="0",model_name="mla"}': 2.0,
        'vllm:num_requests_running{engine="0",model_name="mla"}': 0.0}


def test_a_failed_read_raises_instead_of_saving_nothing(server, tmp_path, monkeypatch):
    monkeypatch.setattr(samples, "SAMPLES", tmp_path)
    with pytest.raises(AssertionError, match="reading .*/nothing failed"):
        samples.record("decode-test", server + "/nothing")
    assert not list(tmp_path.iterdir())


def test_only_loopback_and_the_pod_network_are_scraped():
    with pytest.raises(ValueError, match="only loopback"):
        samples.record("decode-test", "http://10.0.0.1:8000/metrics")
    with pytest.raises(ValueError, match="sample name"):
        samples.record("../escape", "http://127.0.0.1:1/metrics")


def test_a_missing_sample_names_the_command_that_records_it():
    with pytest.raises(AssertionError, match="record_samples"):
        samples.load("no-such-sample")


def test_input_series_keep_absent_series_absent_and_mark_them_stale():
    before = {'a_total{x="1"}': 1.0, 'gone{x="1"}': 5.0}
    after = {'a_total{x="1"}': 3.0, 'new{x="1"}': 0.5}
    series = {s["series"]: s["values"] for s in samples.input_series(
        before, after, {"pod": "glm-decode-0", "x": "2"}, 3, 2, 2)}
    assert series == {
        'a_total{pod="glm-decode-0",x="2"}': "1x2 stale _x1 3x1",
        'gone{pod="glm-decode-0",x="2"}': "5x2 stale _x1 _x2",
        'new{pod="glm-decode-0",x="2"}': "_x3 _x2 0.5x1"}
    no_gap = samples.input_series(before, after, {}, 1, 0, 1)
    assert {s["series"]: s["values"] for s in no_gap}['gone{x="1"}'] == "5x0 stale"


def test_the_doc_quotes_the_recorded_run():
    """docs/observability.md's fault table gives the client figures of samples/run.json."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    table = doc.split("## Data-path faults: what the alerts mean", 1)[1].split("\n## ", 1)[0]
    steps = {s["step"]: s.get("client", {})
             for s in json.loads((samples.SAMPLES / "run.json").read_text())["steps"]}
    killed = steps["decode-killed"]
    assert not killed["chunked_terminator_received"] and not killed["error_events"]
    expected = [
        f"no token, {steps['prefill-lost']['seconds']} s",
        f"no token, after {steps['side-channel-unreachable']['seconds']} s",
        f"{killed['content_chunks']} content chunks, then the router closed the connection "
        f"{killed['client_s_after_kill']} s after the kill",
    ]
    missing = [text for text in expected if text not in table]
    assert not missing, f"docs/observability.md does not quote samples/run.json: {missing}"
