"""The real Prometheus and promtool (tools/build-prometheus.sh), the shipped dashboards and
rules, and a loopback Prometheus loaded with simulated series (tests/observability/series.py).

Used by the observability tests and by tools/render_dashboards.py."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "longctx"
DASHBOARDS = CHART / "dashboards"
RULES = CHART / "rules" / "longctx-alerts.yaml"
BUILD_SCRIPT = REPO / "tools" / "build-prometheus.sh"

# What a dashboard's template variables stand for when its queries run against the
# simulated series (they match tests/observability/series.py's deployment).
RATE_INTERVAL = "2m"


def bin_dir() -> Path:
    """prometheus and promtool: LONGCTX_PROMETHEUS_BIN_DIR, or tools/build-prometheus.sh."""
    override = os.environ.get("LONGCTX_PROMETHEUS_BIN_DIR")
    if override:
        path = Path(override)
    else:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
        assert proc.returncode == 0, "tools/build-prometheus.sh failed (see its output above)"
        path = Path(proc.stdout.strip().splitlines()[-1])
    for name in ("prometheus", "promtool"):
        assert (path / name).is_file(), (
            f"{path / name} is missing: run tools/build-prometheus.sh (or point "
            "LONGCTX_PROMETHEUS_BIN_DIR at a directory holding prometheus and promtool 3.16)")
    return path


# ---------------------------------------------------------------- dashboards and rules


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    panel_type: str
    ref_id: str
    expr: str
    legend: str
    instant: bool


def dashboards() -> dict[str, dict[str, Any]]:
    """Every shipped dashboard, by file stem."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            yield panel


def queries(name: str, dashboard: dict[str, Any]) -> list[Query]:
    return [Query(name, p["title"], p["type"], t["refId"], t["expr"], t.get("legendFormat", ""),
                  bool(t.get("instant")))
            for p in panels(dashboard) for t in p["targets"]]


def all_queries() -> list[Query]:
    return [q for name, d in dashboards().items() for q in queries(name, d)]


def substitute(expr: str, values: dict[str, str]) -> str:
    """A panel's PromQL with Grafana's variables replaced as Grafana would."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for var, value in values.items():
        out = out.replace("${" + var + "}", value).replace("$" + var, value)
    assert "$" not in out, f"unknown template variable left in {expr!r}"
    return out


def rule_groups() -> list[dict[str, Any]]:
    return yaml.safe_load(RULES.read_text())["groups"]


def rule_exprs() -> list[tuple[str, str]]:
    return [(r.get("alert") or r["record"], r["expr"]) for g in rule_groups() for r in g["rules"]]


# ---------------------------------------------------------------- a loopback Prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus on 127.0.0.1 serving a TSDB backfilled from an OpenMetrics text."""

    def __init__(self, openmetrics: str):
        self.bins = bin_dir()
        self._tmp = tempfile.TemporaryDirectory(prefix="longctx-prom-")
        self.dir = Path(self._tmp.name)
        self.openmetrics = openmetrics
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "Prometheus":
        data = self.dir / "data"
        source = self.dir / "series.om.txt"
        source.write_text(self.openmetrics)
        proc = subprocess.run([str(self.bins / "promtool"), "tsdb", "create-blocks-from",
                               "openmetrics", str(source), str(data)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"promtool tsdb create-blocks-from openmetrics:\n{proc.stderr}"
        config = self.dir / "prometheus.yml"
        config.write_text("global: {}\n")  # nothing to scrape: every sample is backfilled
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(self.dir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [str(self.bins / "prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
             # Blocks keep their simulated timestamps; nothing may be dropped as too old.
             "--storage.tsdb.retention.time=100y", "--query.lookback-delta=5m"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.dir / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        raise AssertionError("prometheus did not become ready:\n"
                             + (self.dir / "prometheus.log").read_text())

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.log.close()
        self._tmp.cleanup()

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; returns `data`, raises AssertionError with Prometheus' error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        assert body["status"] == "success", f"{path} {params}: {body.get('error')}"
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def query(self, expr: str, at: float) -> list[dict]:
        return self.api("query", query=expr, time=at)["result"]


def metric_names(prom: Prometheus, expr: str) -> set[str]:
    """Every metric name a PromQL expression selects, from Prometheus' own parser."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("vectorSelector", "matrixSelector"):
                name = node.get("name") or next(
                    (m["value"] for m in node.get("matchers", []) if m["name"] == "__name__"), "")
                assert name and not re.search(r"[^a-zA-Z0-9_:]", name), (
                    f"{expr!r} selects metrics by a pattern; name each metric")
                names.add(name)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(prom.api("parse_query", query=expr))
    return names
