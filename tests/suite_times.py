"""What `make test` costs: the run's JUnit report (pytest --junitxml) recorded as figures
(make-test.json of the run, tests/figures.py), per test module and per real-engine case, from
which `make figures` generates the table of docs/test-harness.md; and whether the run kept
to its budget (exit code 1 when not, naming the bound).

    tools/measure-make-test.sh               # runs make test, then records it
    python -m tests.suite_times JUNIT CASE   # records a report already written
"""

from __future__ import annotations

import argparse
import os
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from tests.figures import Figures

FIGURES = Figures("make-test", "make-test")
# `make test` with warm caches on 2 cores (README); CI adds the cold builds within 90 minutes.
WARM_BUDGET_S = 30 * 60
# Tests whose own time is reported one by one: each starts real engines.
ONE_BY_ONE = ("tests.cluster.day_two.", "tests.cluster.test_real_engines")


def module_of(classname: str) -> str:
    """tests.cluster.test_rollout, from pytest's classname (a module, or module.Class)."""
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return ".".join(parts) or classname


def summary(junit: Path) -> dict[str, Any]:
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, f"{junit}: no testsuite"
    by_module: Counter[str] = Counter()
    one_by_one: dict[str, float] = {}
    for case in suite.iter("testcase"):
        seconds = float(case.get("time") or 0)
        module = module_of(case.get("classname", ""))
        by_module[module] += seconds
        if module.startswith(ONE_BY_ONE) and seconds >= 5:
            one_by_one[f"{module.rpartition('.')[2]}::{case.get('name')}"] = round(seconds, 1)
    return {"seconds": round(float(suite.get("time") or 0)), "tests": int(suite.get("tests", 0)),
            "failures": int(suite.get("failures", 0)) + int(suite.get("errors", 0)),
            "skipped": int(suite.get("skipped", 0)), "cores": os.cpu_count(),
            "modules_s": {m: round(s, 1) for m, s in by_module.most_common()},
            "real_engine_tests_s": one_by_one}


def over_budget(figures: dict[str, Any]) -> list[str]:
    """Why a warm run of `make test` missed its budget; empty when it kept to it."""
    reasons = []
    if figures["failures"]:
        reasons.append(f"{figures['failures']} tests failed")
    if figures["seconds"] > WARM_BUDGET_S:
        reasons.append(f"took {figures['seconds']} s, over the {WARM_BUDGET_S} s budget "
                       f"(on {figures['cores']} cores)")
    return reasons


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("case", help="what was run, e.g. 'make test, warm'")
    parser.add_argument("--load", help="the load average when the run started")
    args = parser.parse_args()
    figures = summary(args.junit)
    if args.load:
        figures["load_average_at_start"] = args.load
    FIGURES.record(args.case, figures)
    reasons = over_budget(figures)
    for reason in reasons:
        print(f"[make-test] over budget: {reason}")
    return 1 if reasons else 0


if __name__ == "__main__":
    raise SystemExit(main())
