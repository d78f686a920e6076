"""Figures the tests and benchmarks measure on real engines and a real control plane, and the
tables of docs/ generated from them.

A run records its figures beside the tree, never into tracked files: `Figures.record` writes
build/figures/<run>/<name>.json (git ignores build/), one folder a run, named for when it
started and the commit it ran on, and every case records that commit and whether the tree
differed from it. Child processes write into their parent's run (LONGCTX_FIGURES_RUN).
The committed figures, docs/figures/<name>.json, and the tables generated from them change
only through `make figures`:

    make figures                              # the latest run's figures into docs/figures, then every table
    make figures RUN=build/figures/<run>      # a given run's
    python -m tests.figures                   # names each table that differs from its JSON, exit code 1

A table sits between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->` in its document;
tests/test_figures.py fails when one differs from what its committed JSON generates.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.figure_tables import TABLES, Cases

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
FIGURES_DIR = DOCS / "figures"
RUNS = REPO / "build" / "figures"
RUN_ENV = "LONGCTX_FIGURES_RUN"


def load(name: str) -> Cases:
    """docs/figures/<name>.json; or, for a name that is a path in the repository, a data file
    a command writes elsewhere (the CPU calibration), as its one case."""
    if "/" in name:
        path = REPO / name
        data = json.loads(path.read_text()) if path.exists() else None
        return {"calibration": {**data, "measured": data.get("measuredAt", "?")}} if data else {}
    path = FIGURES_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


@functools.cache
def source() -> dict[str, Any]:
    """The commit the tree is at, and whether its tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):   # an export without .git
        return {"commit": None, "dirty": None}


def new_run() -> Path:
    """A new run folder under build/figures, named for the time and the commit."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    commit, dirty = source()["commit"], source()["dirty"]
    name = f"{now}-{(commit or 'nocommit')[:10]}{'-dirty' if dirty else ''}-{os.getpid()}"
    path = RUNS / name
    path.mkdir(parents=True)
    return path


def this_run() -> Path:
    """This process's run folder (its parent's, when it set LONGCTX_FIGURES_RUN), made at the
    first record and named on the terminal."""
    if not os.environ.get(RUN_ENV):
        os.environ[RUN_ENV] = str(new_run())
        sys.__stdout__.write(f"\n[figures] this run records into {os.environ[RUN_ENV]}; "
                             "`make figures` puts them into docs/\n")
    path = Path(os.environ[RUN_ENV])
    path.mkdir(parents=True, exist_ok=True)
    return path


def latest_run() -> Path | None:
    runs = sorted(p for p in RUNS.glob("*") if p.is_dir() and any(p.glob("*.json")))
    return runs[-1] if runs else None


class Figures:
    """A module's figures by case, recorded into this run's <name>.json (this_run), each case
    with the UTC date it was measured and the commit it ran on. Recording a case again in the
    same run adds to it. Each record is echoed to the terminal as `[tag] case: {...}`, since
    pytest captures sys.stdout."""

    def __init__(self, name: str, tag: str):
        self.name, self.tag = name, tag

    def record(self, case: str, figures: dict[str, Any]) -> None:
        sys.__stdout__.write(f"\n[{self.tag}] {case}: {json.dumps(figures)}\n")
        sys.__stdout__.flush()
        path = this_run() / f"{self.name}.json"
        cases = json.loads(path.read_text()) if path.exists() else {}
        if case not in cases:
            cases[case] = {"measured": datetime.datetime.now(datetime.timezone.utc)
                           .strftime("%Y-%m-%d"), **source()}
        cases[case].update(figures)
        path.write_text(json.dumps(cases, indent=1) + "\n")


def take(run: Path) -> list[str]:
    """Puts a run's figures into docs/figures: each <name>.json it recorded replaces the
    committed one whole, so a table shows one run of one tree, never cases of earlier runs
    beside it (a run of part of a module leaves out the rest, which `git diff` shows).
    Returns the names taken."""
    names = []
    for path in sorted(run.glob("*.json")):
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        cases = json.loads(path.read_text())
        (FIGURES_DIR / path.name).write_text(json.dumps(cases, indent=1) + "\n")
        names.append(path.stem)
    return names


def generate(name: str) -> str:
    """Table `name` from its JSON, with a line saying where, when and at which commits it
    was measured."""
    table = TABLES[name]
    sources = {s: load(s) for s in table.sources}
    files = " and ".join(f"`{s}`" if "/" in s else f"`docs/figures/{s}.json`"
                         for s in table.sources)
    if not any(sources.values()):
        return f"No run recorded yet: {table.fills} records {files} and fills this table."
    recorded = [f for cases in sources.values() for f in cases.values()]
    dates = sorted({f.get("measured", "?") for f in recorded})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    commits = sorted({f["commit"][:10] + (" with local changes" if f.get("dirty") else "")
                      for f in recorded if f.get("commit")})
    at = f" at commit {', '.join(commits)}" if commits else ""
    return "\n".join(table.build(sources) + ["", f"From {files}, measured {when}{at}; "
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


def write_tables() -> None:
    """Rewrites every generated table from the committed JSON."""
    for doc in sorted({t.doc for t in TABLES.values()}):
        path = DOCS / doc
        text = path.read_text()
        updated = render(doc, text)
        if updated != text:
            path.write_text(updated)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--new-run"]:
        print(new_run())
        return 0
    if argv[:1] == ["--write"]:
        run = Path(argv[1]) if len(argv) > 1 and argv[1] else latest_run()
        if run is not None and not run.is_dir():
            raise SystemExit(f"RUN={run}: no such run folder (runs are under {RUNS})")
        names = take(run) if run is not None else []
        print(f"[figures] {', '.join(names)} from {run}" if names else
              f"[figures] no run recorded under {RUNS}: the tables as docs/figures gives them")
        write_tables()
        return 0
    differing = stale()
    for line in differing:
        print(f"{line} differs from its JSON: run `make figures`")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
