"""The README's claims that a test can check: every path its layout table names exists."""

from __future__ import annotations

import re

from tests.conftest import REPO

PATH = re.compile(r"`([\w./-]+(?:/|\.(?:py|sh|yaml|md|cu|txt|toml)))`")


def layout_rows() -> list[tuple[str, list[str]]]:
    """Each row of the README's layout table: its folder and the paths it names in it."""
    section = REPO.joinpath("README.md").read_text().split("\n## Layout\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) == 2:
            rows.append((cells[0].strip("| `"), PATH.findall(cells[1])))
    return rows


def test_every_path_the_layout_table_names_exists():
    rows = layout_rows()
    assert len(rows) >= 8, rows
    missing = [f"{folder}{path}" for folder, paths in rows for path in paths
               if not (REPO / folder / path).exists()]
    missing += [folder for folder, _ in rows if not (REPO / folder).is_dir()]
    assert not missing, f"the README's layout names paths that do not exist: {missing}"
    assert sum(len(paths) for _, paths in rows) >= 30
