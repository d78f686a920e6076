"""docs/reliability.md's tables are the tests' case tables (python -m tests.reliability_doc)."""

from __future__ import annotations

from tests import reliability_doc


def test_the_reliability_tables_are_generated_from_the_case_tables():
    current = reliability_doc.DOC.read_text()
    assert current == reliability_doc.render(current), (
        "docs/reliability.md is stale: run `python -m tests.reliability_doc --write`")


def test_the_hostile_input_table_has_at_least_forty_cases_in_every_category():
    from tests.cluster.test_hostile_input import CASES
    assert len(CASES) >= 40
    assert {c.category for c in CASES} >= {
        "names and lengths", "quantity fields: negative, absurd, malformed",
        "unicode and control characters", "argv injection (extraArgs, model names)",
        "huge or deeply nested values", "duplicate flags",
        "cross-field rules (the API's rule table)"}
