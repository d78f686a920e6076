"""The tables of docs/reliability.md, generated from the tests' own case tables.

    python -m tests.reliability_doc            # print the generated sections
    python -m tests.reliability_doc --write    # rewrite them in docs/reliability.md

"survived" counts the cases whose test passed in the last recorded run: tests/conftest.py
records every test's outcome in pytest's cache (.pytest_cache), merged over runs. A row none
of whose tests has run here keeps the document's figure while its case count is unchanged,
else reads "not run". tests/test_reliability_doc.py fails when the document is stale, so
after `make test` (which runs the cluster tests first) it holds that run's outcomes.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "reliability.md"
# Where tests/conftest.py keeps the outcomes (pytest's cache, key OUTCOMES_KEY).
OUTCOMES_KEY = "longctx/outcomes"
OUTCOMES_FILE = REPO / ".pytest_cache" / "v" / OUTCOMES_KEY
NOT_RUN = "not run"
HOSTILE = "tests/cluster/test_hostile_input.py"
FAULTS_FILE = "tests/cluster/test_control_plane_faults.py"
# The test of each row of test_control_plane_faults.FAULTS, in its order.
FAULT_TESTS = [
    "test_random_operator_sigkills_end_with_exactly_the_desired_objects",
    "test_apiserver_restart_is_recovered_through_the_watches",
    "test_an_etcd_pause_does_not_crash_the_operator",
    "test_a_conflict_storm_ends_restored_at_a_bounded_write_rate",
    "test_two_peered_replicas_one_writes_and_killing_the_leader_hands_over",
    "test_a_transient_admission_denial_is_retried_with_backoff_and_converges_alone",
]
Outcomes = dict[str, str]   # pytest node id -> "passed", "failed" or "skipped"


def load_outcomes() -> Outcomes:
    return json.loads(OUTCOMES_FILE.read_text()) if OUTCOMES_FILE.exists() else {}


def hostile_test(case) -> str:
    """The node id of the test that asserts a hostile-input case."""
    from tests.cluster.test_hostile_input import APPLY

    if case.stage == APPLY:
        return f"{HOSTILE}::test_refused_at_apply_naming_the_field[{case.id}]"
    return f"{HOSTILE}::test_refused_by_the_planner_while_nothing_running_changes"


def survived(tests: list[str], outcomes: Outcomes) -> Optional[int]:
    """How many of the cases (one node id each) passed; None when one has no outcome."""
    if any(t not in outcomes for t in tests):
        return None
    return sum(outcomes[t] == "passed" for t in tests)


def _documented(text: str, name: str) -> dict[str, tuple[str, str]]:
    """The (cases, survived) cells of each row of a generated table, by its first cell."""
    block = re.search(rf"<!-- BEGIN {name} \(generated\) -->\n(.*?)<!-- END {name} -->", text,
                      re.DOTALL)
    rows = [line.strip("| ").split(" | ") for line in (block.group(1) if block else "")
            .splitlines() if line.startswith("| ")]
    return {r[0]: (r[1], r[2]) for r in rows if len(r) == 4}


def _survived_cell(first: str, cases: int, count: Optional[int],
                   documented: dict[str, tuple[str, str]]) -> str:
    if count is not None:
        return str(count)
    old = documented.get(first)
    return old[1] if old is not None and old[0] == str(cases) else NOT_RUN


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def hostile_input(outcomes: Outcomes, documented: dict[str, tuple[str, str]]) -> str:
    from tests.cluster.test_hostile_input import APPLY, CASES

    lines = [_row("fault or input", "cases", "survived", "lost or changed"),
             _row("---", "---:", "---:", "---")]
    order = list(dict.fromkeys(c.category for c in CASES))
    for category in order:
        cases = [c for c in CASES if c.category == category]
        stages = Counter(c.stage for c in cases)
        how = ", ".join(f"{n} refused {'at apply' if s == APPLY else 'by the planner'}"
                        for s, n in stages.items())
        count = survived([hostile_test(c) for c in cases], outcomes)
        lines.append(_row(category, len(cases), _survived_cell(category, len(cases), count,
                                                               documented), f"nothing ({how})"))
    total = "**all hostile input**"
    count = survived([hostile_test(c) for c in CASES], outcomes)
    lines.append(_row(total, len(CASES), _survived_cell(total, len(CASES), count, documented),
                      "nothing"))
    lines += ["", "Each case and what it got:", "",
              _row("case", "refused", "the message names"), _row("---", "---", "---")]
    for c in CASES:
        got = "at apply" if c.stage == APPLY else f"{c.condition}=False, nothing rolled"
        lines.append(_row(f"`{c.id}`", got, f"`{c.field}`"))
    return "\n".join(lines)


def control_plane(outcomes: Outcomes, documented: dict[str, tuple[str, str]]) -> str:
    from tests.cluster.test_control_plane_faults import FAULTS

    assert len(FAULT_TESTS) == len(FAULTS), "FAULT_TESTS must name the test of each fault"
    lines = [_row("fault or input", "cases", "survived", "lost or changed"),
             _row("---", "---:", "---:", "---")]
    for (fault, cases, lost), test in zip(FAULTS, FAULT_TESTS):
        # One test drives all of a row's cases: they survived together or not at all.
        passed = survived([f"{FAULTS_FILE}::{test}"], outcomes)
        count = None if passed is None else cases * passed
        lines.append(_row(fault, cases, _survived_cell(fault, cases, count, documented), lost))
    return "\n".join(lines)


DAY_TWO = "tests/cluster/day_two"


def data_path(outcomes: Outcomes, documented: dict[str, tuple[str, str]]) -> str:
    from tests.cluster.day_two import test_data_path_faults, test_traffic_rollouts

    lines = [_row("fault or input", "cases", "survived", "lost or changed"),
             _row("---", "---:", "---:", "---")]
    for module in (test_data_path_faults, test_traffic_rollouts):
        path = f"{DAY_TWO}/{module.__name__.rsplit('.', 1)[-1]}.py"
        for case, test, lost in module.CASES:
            count = survived([f"{path}::{test}"], outcomes)
            lines.append(_row(case, 1, _survived_cell(case, 1, count, documented), lost))
    return "\n".join(lines)


SECTIONS = {"hostile-input": hostile_input, "control-plane": control_plane,
            "data-path": data_path}


def render(text: str, outcomes: Outcomes) -> str:
    for name, build in SECTIONS.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} \(generated\) -->\n).*?(<!-- END {name} -->)",
                             re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: no BEGIN/END markers for {name}")
        table = build(outcomes, _documented(text, name))
        text = pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)
    return text


def main() -> None:
    current = DOC.read_text()
    updated = render(current, load_outcomes())
    if "--write" in sys.argv[1:]:
        DOC.write_text(updated)
    else:
        print(updated)


if __name__ == "__main__":
    main()
