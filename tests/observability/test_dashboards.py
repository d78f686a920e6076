"""The shipped Grafana dashboards: well-formed JSON of the dashboard model, and every panel's
PromQL run by a real Prometheus (127.0.0.1) over the simulated series: no query may fail or
come back empty."""

from __future__ import annotations

import math
import re

import pytest

from tests.observability import prom, series

BOARDS = prom.dashboards()
QUERIES = prom.all_queries()
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_the_five_dashboards_exist_with_unique_uids():
    assert sorted(BOARDS) == ["longctx-decode", "longctx-kv-transfer", "longctx-operator",
                              "longctx-prefill", "longctx-router"]
    assert len({b["uid"] for b in BOARDS.values()}) == len(BOARDS)
    for name, board in BOARDS.items():
        assert board["uid"] == name and board["title"].startswith("longctx / ")


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panels_are_well_formed(name):
    board = BOARDS[name]
    variables = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in variables
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in prom.panels(board):
        where = f"{name}: {panel['title']}"
        assert panel["type"] in ("timeseries", "stat"), where
        assert panel["datasource"] == DATASOURCE, where
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["w"] > 0 and pos["h"] > 0, where
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), where
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, where
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= variables | {"__rate_interval"}, (where, used - variables)


def finite(result: list[dict]) -> bool:
    values = [v for r in result for v in (r.get("values") or [r["value"]])]
    return any(math.isfinite(float(v[1])) for v in values)


@pytest.mark.parametrize("query", QUERIES, ids=[f"{q.dashboard}/{q.panel}/{q.ref_id}"
                                                for q in QUERIES])
def test_every_panel_query_returns_data(prometheus, query):
    expr = prom.substitute(query.expr, series.VARIABLES)
    start, end = series.window()
    if query.instant:
        result = prometheus.query(expr, end)
    else:
        result = prometheus.query_range(expr, start, end, 60)
    assert result and finite(result), f"{query.dashboard} / {query.panel}: empty for {expr}"
