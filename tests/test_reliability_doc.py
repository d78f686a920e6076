"""docs/reliability.md's tables are the tests' case tables, and their "survived" column the
recorded outcomes of those cases' tests (python -m tests.reliability_doc)."""

from __future__ import annotations

import ast

from tests import reliability_doc
from tests.conftest import OUTCOMES_KEY, REPO


def test_the_reliability_tables_are_generated_from_the_case_tables(test_outcomes):
    current = reliability_doc.DOC.read_text()
    relevant = (reliability_doc.HOSTILE, reliability_doc.FAULTS_FILE)
    failed = sorted(t for t, outcome in test_outcomes.items()
                    if t.startswith(relevant) and outcome != "passed")
    assert current == reliability_doc.render(current, test_outcomes), (
        "docs/reliability.md is stale: run `python -m tests.reliability_doc --write` after the "
        f"cluster tests; not passed in the last run: {failed}")


def test_survived_counts_passed_cases_and_a_failure_shows():
    from tests.cluster.test_hostile_input import CASES
    outcomes = {reliability_doc.hostile_test(c): "passed" for c in CASES}
    first = reliability_doc.hostile_test(CASES[0])
    outcomes[first] = "failed"
    text = reliability_doc.render(reliability_doc.DOC.read_text(), outcomes)
    total = reliability_doc._documented(text, "hostile-input")["**all hostile input**"]
    assert total == (str(len(CASES)), str(len(CASES) - 1))
    del outcomes[first]   # never run: the documented figure stands while the count is the same
    text = reliability_doc.render(text, outcomes)
    assert reliability_doc._documented(text, "hostile-input")["**all hostile input**"] == total
    assert reliability_doc._survived_cell("x", 3, None, {"x": ("2", "2")}) == "not run"


def test_a_failed_fault_test_counts_none_of_its_cases():
    outcomes = {f"{reliability_doc.FAULTS_FILE}::{t}": "passed"
                for t in reliability_doc.FAULT_TESTS}
    outcomes[f"{reliability_doc.FAULTS_FILE}::{reliability_doc.FAULT_TESTS[0]}"] = "failed"
    rows = reliability_doc._documented(reliability_doc.render(
        reliability_doc.DOC.read_text(), outcomes), "control-plane")
    sigkills = next(cells for fault, cells in rows.items() if "SIGKILL" in fault)
    assert sigkills[1] == "0" and all(c[1] == c[0] for f, c in rows.items() if f not in
                                      ("fault or input", "---") and "SIGKILL" not in f)


def test_every_documented_figure_is_at_most_its_case_count():
    text = reliability_doc.DOC.read_text()
    for name in reliability_doc.SECTIONS:
        for first, (cases, survived) in reliability_doc._documented(text, name).items():
            if cases.isdigit():
                assert survived == reliability_doc.NOT_RUN or int(survived) <= int(cases), first


def test_the_fault_tests_named_exist_and_the_outcomes_are_kept_where_the_doc_reads():
    tree = ast.parse((REPO / reliability_doc.FAULTS_FILE).read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(reliability_doc.FAULT_TESTS) <= defined
    assert reliability_doc.OUTCOMES_KEY == OUTCOMES_KEY


def test_the_hostile_input_table_has_at_least_forty_cases_in_every_category():
    from tests.cluster.test_hostile_input import CASES
    assert len(CASES) >= 40
    assert {c.category for c in CASES} >= {
        "names and lengths", "quantity fields: negative, absurd, malformed",
        "unicode and control characters", "argv injection (extraArgs, model names)",
        "huge or deeply nested values", "duplicate flags",
        "cross-field rules (the API's rule table)"}
