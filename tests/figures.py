"""Figures the tests measure on real engines and a real control plane, kept in
docs/figures/<name>.json (committed), and the tables of docs/data-path.md, docs/bench.md and
docs/reliability.md generated from them.

    make figures                    # every generated table of docs/, rewritten
    python -m tests.figures         # names each table that differs, exit code 1

A table sits between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->` in its document;
tests/test_docs.py fails when one differs from what its JSON generates. `Figures.record`
writes the JSON and rewrites the tables built from it at once, so a run leaves the documents
matching its figures (`make test` runs the cluster modules before tests/test_docs.py).
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

from tests.figure_tables import TABLES, Cases

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
FIGURES_DIR = DOCS / "figures"


def load(name: str) -> Cases:
    """docs/figures/<name>.json; or, for a name that is a path in the repository, a data file
    a command writes elsewhere (the CPU calibration), as its one case."""
    if "/" in name:
        path = REPO / name
        data = json.loads(path.read_text()) if path.exists() else None
        return {"calibration": {**data, "measured": data.get("measuredAt", "?")}} if data else {}
    path = FIGURES_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


class Figures:
    """A module's figures by case, in docs/figures/<name>.json, each case with the UTC date
    it was measured. A case recorded by this run replaces what an earlier run recorded for
    it; the cases this run did not reach keep their figures (and their date). Each record is
    echoed to the terminal as `[tag] case: {...}`, since pytest captures sys.stdout."""

    def __init__(self, name: str, tag: str):
        self.name, self.tag = name, tag
        self._this_run: set[str] = set()

    def record(self, case: str, figures: dict[str, Any]) -> None:
        sys.__stdout__.write(f"\n[{self.tag}] {case}: {json.dumps(figures)}\n")
        sys.__stdout__.flush()
        cases = load(self.name)
        if case not in self._this_run:
            self._this_run.add(case)
            cases[case] = {"measured": datetime.datetime.now(datetime.timezone.utc)
                           .strftime("%Y-%m-%d")}
        cases[case].update(figures)
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        (FIGURES_DIR / f"{self.name}.json").write_text(json.dumps(cases, indent=1) + "\n")
        write_tables({self.name})


def generate(name: str) -> str:
    """Table `name` from its JSON, with a line saying where and when it was measured."""
    table = TABLES[name]
    sources = {s: load(s) for s in table.sources}
    files = " and ".join(f"`{s}`" if "/" in s else f"`docs/figures/{s}.json`"
                         for s in table.sources)
    if not any(sources.values()):
        return f"No run recorded yet: {table.fills} records {files} and fills this table."
    dates = sorted({f.get("measured", "?") for cases in sources.values()
                    for f in cases.values()})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return "\n".join(table.build(sources) + ["", f"From {files}, measured {when}; "
                                                 f"{table.fills} measures it again."])


def region(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- figures:{re.escape(name)} -->\n).*?(<!-- /figures:"
                      rf"{re.escape(name)} -->)", re.DOTALL)


def render(doc: str, text: str) -> str:
    """`text` (docs/<doc>) with each of its generated tables as the JSON gives it."""
    for name, table in TABLES.items():
        if table.doc != doc:
            continue
        pattern = region(name)
        if not pattern.search(text):
            raise AssertionError(f"docs/{doc} has no <!-- figures:{name} --> ... "
                                 f"<!-- /figures:{name} --> region: add the two markers, "
                                 "each on its own line, where the table goes")
        generated = generate(name)
        text = pattern.sub(lambda m: m.group(1) + generated + "\n" + m.group(2), text)
    unknown = set(re.findall(r"<!-- figures:([\w-]+) -->", text)) - set(TABLES)
    assert not unknown, f"docs/{doc}: no table is generated for {sorted(unknown)}"
    return text


def stale() -> list[str]:
    """The generated tables whose document differs from what the JSON gives."""
    out = []
    for doc in sorted({t.doc for t in TABLES.values()}):
        text = (DOCS / doc).read_text()
        out += [f"docs/{doc}: figures:{name}" for name, t in TABLES.items()
                if t.doc == doc and region(name).search(text).group(0)
                != region(name).search(render(doc, text)).group(0)]
    return out


def write_tables(sources: set[str] | None = None) -> None:
    """Rewrites the tables built from `sources` (every table when None)."""
    docs = {t.doc for t in TABLES.values() if sources is None or sources & set(t.sources)}
    for doc in sorted(docs):
        path = DOCS / doc
        text = path.read_text()
        updated = render(doc, text)
        if updated != text:
            path.write_text(updated)


def main() -> int:
    if "--write" in sys.argv[1:]:
        write_tables()
        return 0
    differing = stale()
    for line in differing:
        print(f"{line} differs from its JSON: run `make figures`")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
