"""The tables of docs/reliability.md, generated from the tests' own case tables.

    python -m tests.reliability_doc            # print the generated sections
    python -m tests.reliability_doc --write    # rewrite them in docs/reliability.md

Each case counts as survived because its test asserts it: a failing case fails `make test`,
not this table. tests/test_reliability_doc.py fails when the document is stale.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def hostile_input() -> str:
    from tests.cluster.test_hostile_input import APPLY, CASES

    lines = [_row("fault or input", "cases", "survived", "lost or changed"),
             _row("---", "---:", "---:", "---")]
    order = list(dict.fromkeys(c.category for c in CASES))
    for category in order:
        cases = [c for c in CASES if c.category == category]
        stages = Counter(c.stage for c in cases)
        how = ", ".join(f"{n} refused {'at apply' if s == APPLY else 'by the planner'}"
                        for s, n in stages.items())
        lines.append(_row(category, len(cases), len(cases), f"nothing ({how})"))
    lines.append(_row("**all hostile input**", len(CASES), len(CASES), "nothing"))
    lines += ["", "Each case and what it got:", "",
              _row("case", "refused", "the message names"), _row("---", "---", "---")]
    for c in CASES:
        got = "at apply" if c.stage == APPLY else f"{c.condition}=False, nothing rolled"
        lines.append(_row(f"`{c.id}`", got, f"`{c.field}`"))
    return "\n".join(lines)


def control_plane() -> str:
    from tests.cluster.test_control_plane_faults import FAULTS

    lines = [_row("fault or input", "cases", "survived", "lost or changed"),
             _row("---", "---:", "---:", "---")]
    lines += [_row(fault, cases, cases, lost) for fault, cases, lost in FAULTS]
    return "\n".join(lines)


SECTIONS = {"hostile-input": hostile_input, "control-plane": control_plane}


def render(text: str) -> str:
    for name, build in SECTIONS.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} \(generated\) -->\n).*?(<!-- END {name} -->)",
                             re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: no BEGIN/END markers for {name}")
        text = pattern.sub(lambda m: m.group(1) + build() + "\n" + m.group(2), text)
    return text


def main() -> None:
    current = DOC.read_text()
    updated = render(current)
    if "--write" in sys.argv[1:]:
        DOC.write_text(updated)
    else:
        print(updated)


if __name__ == "__main__":
    main()
