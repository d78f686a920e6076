"""The alert rules with the real promtool: `check rules`, and `test rules` with input series
for each alert that fire it and that must not; the data-path alerts also on /metrics pages
recorded from real engines before and after each fault (fault-alerts-test.yaml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.observability import prom, samples

UNIT_TESTS = Path(__file__).with_name("alerts-test.yaml")
FAULT_TESTS = Path(__file__).with_name("fault-alerts-test.yaml")
ALERTS = {"LongctxKVTransferFailures", "LongctxKVLoadFailedRequests", "LongctxKVLeaseExpired",
          "LongctxKVReadAfterExpiry", "LongctxTTFTBudgetBurnFast", "LongctxTTFTBudgetBurnSlow",
          "LongctxDecodeHostPoolNearFull", "LongctxEngineCrashLooping", "LongctxEngineRestarted",
          "LongctxRolloutStuck", "LongctxRolloutSlow", "LongctxReconcileErrors",
          "LongctxAnswersContinued", "LongctxAnswersLost", "LongctxServedByPrefillOnly"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(prom.bin_dir() / "promtool"), *args], capture_output=True,
                          text=True, timeout=120)


def test_the_rule_file_holds_the_documented_alerts():
    alerts = {r["alert"] for g in prom.rule_groups() for r in g["rules"] if "alert" in r}
    assert alerts == ALERTS
    for group in prom.rule_groups():
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
                assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_promtool_check_rules():
    proc = promtool("check", "rules", str(prom.RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_promtool_check_rules_rejects_a_broken_rule(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("groups:\n- name: x\n  rules:\n  - alert: X\n    expr: sum(rate(x[5m])\n")
    proc = promtool("check", "rules", str(broken))
    assert proc.returncode != 0 and "parse error" in proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_silent_unit_test():
    tests = (yaml.safe_load(UNIT_TESTS.read_text())["tests"]
             + yaml.safe_load(FAULT_TESTS.read_text())["cases"])
    firing, silent = set(), set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else silent).add(case["alertname"])
    assert firing == ALERTS and silent == ALERTS, (ALERTS - firing, ALERTS - silent)


def test_promtool_test_rules():
    proc = subprocess.run([str(prom.bin_dir() / "promtool"), "test", "rules", UNIT_TESTS.name],
                          capture_output=True, text=True, timeout=120, cwd=UNIT_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def fault_unit_tests() -> dict:
    """fault-alerts-test.yaml as a promtool test file, its input series from the samples."""
    spec = yaml.safe_load(FAULT_TESTS.read_text())
    groups = []
    for case in spec["cases"]:
        groups.append({
            "name": case["name"], "interval": "1m",
            "input_series": samples.input_series(
                samples.load(case["before"]), samples.load(case["after"]), case["labels"],
                spec["before_minutes"], case["down_minutes"], spec["after_minutes"]),
            "alert_rule_test": case["alert_rule_test"]})
    return {"rule_files": [str(prom.RULES)], "evaluation_interval": "1m", "tests": groups}


def test_the_data_path_alerts_fire_on_the_recorded_fault_samples_and_not_before(tmp_path):
    unit_tests = tmp_path / "fault-alerts-test.yaml"
    unit_tests.write_text(yaml.safe_dump(fault_unit_tests(), sort_keys=False))
    proc = promtool("test", "rules", str(unit_tests))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_every_engine_metric_of_the_data_path_alerts_is_in_the_recorded_samples(prometheus):
    """A name an engine does not export would never fire: the alerts read only series the
    recorded pages hold (kube-state-metrics' are not the engines' to export)."""
    cases = yaml.safe_load(FAULT_TESTS.read_text())["cases"]
    alerts = {t["alertname"] for case in cases for t in case["alert_rule_test"]}
    recorded = set().union(*(samples.metric_names(samples.load(p.stem))
                             for p in sorted(samples.SAMPLES.glob("*.prom"))))
    exprs = dict(prom.rule_exprs())
    used = {name: alert for alert in sorted(alerts)
            for name in prom.metric_names(prometheus, exprs[alert])
            if not name.startswith("kube_")}
    assert used, "the data-path alerts read no engine metric"
    missing = {name: alert for name, alert in used.items() if name not in recorded}
    assert not missing, f"not in any recorded page (tests/observability/samples): {missing}"
