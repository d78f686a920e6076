"""The drain of a reconcile reads what the engine watch published, never an engine: no
HTTP on a reconcile thread (drain.py, memory.py, engine_load.py)."""

from __future__ import annotations

import datetime
import http.server
import threading
from typing import Any

from longctx_operator.controller import drain, engine_load, rollout
from longctx_operator.controller.memory import Memory

NOW = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=datetime.timezone.utc)


def test_a_drain_look_reads_the_watchs_readings_and_no_engine():
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        old = {"metadata": {"name": "cr-decode-0", "uid": "u-old",
                            "labels": {"app.kubernetes.io/component": "decode"}},
               "spec": {"containers": [{"ports": [{"name": "vllm-0",
                                                   "containerPort": server.server_address[1]}]}]},
               "status": {"podIP": "127.0.0.1"}}
        revisions = {"old": rollout.Revision("old", {}, [old]),
                     "new": rollout.Revision("new", {}, [])}
        cr = ("ns", "cr")
        memory = Memory()
        pods = drain.draining(revisions, "new", "new")
        assert pods == [old]
        assert memory.idle(cr, pods, NOW) == {}    # nothing read yet
        memory.loads.publish({"u-old": engine_load.PodLoad(0.0, True, NOW + datetime.timedelta(
            seconds=1))})
        memory.idle(cr, pods, NOW + datetime.timedelta(seconds=2))
        memory.loads.publish({"u-old": engine_load.PodLoad(0.0, True, NOW + datetime.timedelta(
            seconds=6))})
        assert memory.idle(cr, pods, NOW + datetime.timedelta(seconds=7)) \
            == {"cr-decode-0": 5.0}
        assert hits == []
    finally:
        server.shutdown()
        server.server_close()
