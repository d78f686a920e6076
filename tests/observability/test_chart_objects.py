"""The chart ships the dashboards as ConfigMaps for Grafana's sidecar (on by default) and the
alerts as a PrometheusRule (opt-in), both byte-for-byte the files under charts/longctx/."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helm.chart import by_kind, documents, helm_binary, run_helm, set_args, template_text
from tests.observability import prom


@pytest.fixture(scope="module")
def helm():
    return helm_binary()


def test_dashboards_are_configmaps_labelled_for_the_grafana_sidecar(helm, tmp_path):
    objs = by_kind(documents(template_text(helm, tmp_path)))
    maps = {m["metadata"]["name"]: m for m in objs["ConfigMap"]
            if m["metadata"]["labels"].get("grafana_dashboard") == "1"}
    assert sorted(maps) == sorted(f"longctx-dashboard-{n.removeprefix('longctx-')}"
                                  for n in prom.dashboards())
    for name, board in prom.dashboards().items():
        (cm,) = [m for m in maps.values() if f"{name}.json" in m["data"]]
        assert json.loads(cm["data"][f"{name}.json"]) == board
        assert cm["metadata"]["namespace"] == "longctx-system"
    assert "PrometheusRule" not in objs


def test_dashboards_can_be_turned_off_and_labelled(helm, tmp_path):
    objs = by_kind(documents(template_text(helm, tmp_path, {"grafanaDashboards.enabled": False})))
    assert not [m for m in objs.get("ConfigMap", [])
                if "grafana_dashboard" in m["metadata"]["labels"]]
    objs = by_kind(documents(template_text(helm, tmp_path, {
        "grafanaDashboards.labels.team": "llm", "grafanaDashboards.annotations.grafana_folder":
        "longctx"})))
    for cm in [m for m in objs["ConfigMap"] if "grafana_dashboard" in m["metadata"]["labels"]]:
        assert cm["metadata"]["labels"]["team"] == "llm"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "longctx"}


def test_prometheus_rule_is_the_rule_file(helm, tmp_path):
    objs = by_kind(documents(template_text(helm, tmp_path, {
        "prometheusRule.enabled": True, "prometheusRule.labels.release": "kube-prometheus"})))
    (rule,) = objs["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    assert rule["spec"] == yaml.safe_load(prom.RULES.read_text())
    # The alert templates reach Prometheus untouched by Helm.
    text = json.dumps(rule["spec"])
    assert "{{ $labels.pod }}" in text


@pytest.mark.parametrize("values", [{"prometheusRule.enabled": True},
                                    {"grafanaDashboards.enabled": False}])
def test_helm_lint_is_clean_with_the_monitoring_values(helm, tmp_path, values):
    proc = run_helm(helm, tmp_path, "lint", "--strict", str(prom.CHART), *set_args(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_schema_rejects_a_bad_monitoring_value(helm, tmp_path):
    proc = run_helm(helm, tmp_path, "template", "x", str(prom.CHART),
                    "--set", "prometheusRule.enable=true", check=False)
    assert proc.returncode != 0 and "additional properties 'enable' not allowed" in proc.stderr
