"""The alert rules with the real promtool: `check rules`, and `test rules` with input series
for each alert that fire it and that must not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.observability import prom

UNIT_TESTS = Path(__file__).with_name("alerts-test.yaml")
ALERTS = {"LongctxKVTransferFailures", "LongctxTTFTBudgetBurnFast", "LongctxTTFTBudgetBurnSlow",
          "LongctxDecodeHostPoolNearFull", "LongctxEngineCrashLooping", "LongctxRolloutStuck", "LongctxRolloutSlow",
          "LongctxReconcileErrors"}


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
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
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
