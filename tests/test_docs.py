"""The repository is self-contained: nothing points outside it, and every `docs/...` path or
Markdown link it cites exists, down to the heading an `#anchor` names.

A user's clone has only the repository, so a citation of a sibling folder or of a document
that was never written is a dead end. Files are the ones git would ship: tracked and
untracked-but-not-ignored, text only.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Spelled in pieces so that this file does not match itself.
OUTSIDE = ("../" + "shared", "shared" + "/docs", "/work/" + "shared")

# A repository-relative `docs/...` path, optionally with an anchor. Not when it continues a
# longer path or names another repository's file (`github.com/x/docs/...`, `owner/repo:docs/...`,
# `../docs/...`): those are checked as Markdown links or are not ours. Not a template either
# (`docs/img/dashboard-<name>.png`, `docs/*.md`).
DOCS_CITATION = re.compile(
    r"(?<![\w/.:@-])docs/(?P<path>(?>[A-Za-z0-9_./-]+))(?![<{*$\[])"
    r"(?:#(?P<anchor>[A-Za-z0-9_-]+))?")
# Inline Markdown links and images: [text](target) / ![alt](target).
MD_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(?P<text>.+?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"(?P<id>[^\"]+)\"")


def shipped_files() -> list[Path]:
    proc = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                          cwd=REPO, capture_output=True, check=True)
    return sorted(REPO / name for name in proc.stdout.decode().split("\0")
                  if name and (REPO / name).is_file())


@lru_cache(maxsize=None)
def text_of(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def text_files() -> list[tuple[Path, str]]:
    out = []
    for path in shipped_files():
        text = text_of(path)
        if text is not None:
            out.append((path, text))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: link and code markup dropped, lower case,
    punctuation removed (letters, digits, '_', '-' and spaces kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = "".join(ch for ch in text
                   if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N"))
    return kept.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a Markdown file defines: its headings (duplicates get -1, -2, ...) and
    explicit <a id=...> tags. Lines inside fenced code blocks are not headings."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in (text_of(path) or "").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        out.update(m.group("id") for m in HTML_ANCHOR.finditer(line))
        m = HEADING.match(line)
        if m:
            slug = github_slug(m.group("text"))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def target_problem(target: Path, anchor: str | None) -> str | None:
    """Why a cited path (and anchor) does not resolve inside the repository, or None."""
    try:
        target.resolve().relative_to(REPO)
    except ValueError:
        return "points outside the repository"
    if not target.exists():
        return "does not exist"
    if anchor:
        if target.suffix != ".md" or not target.is_file():
            return f"has an anchor #{anchor} but is not a Markdown file"
        if anchor not in anchors(target):
            return f"has no heading for #{anchor}"
    return None


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def docs_citation_problems(path: Path, text: str) -> list[str]:
    out = []
    for m in DOCS_CITATION.finditer(text):
        rel = "docs/" + m.group("path").rstrip(".-")
        why = target_problem(REPO / rel, m.group("anchor"))
        if why:
            cited = rel + (f"#{m.group('anchor')}" if m.group("anchor") else "")
            out.append(f"{path.relative_to(REPO)}:{line_of(text, m.start())}: {cited} {why}")
    return out


def markdown_link_problems(path: Path, text: str) -> list[str]:
    out = []
    in_fence = False
    offset = 0
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            for m in MD_LINK.finditer(line):
                target = m.group("target").strip("<>")
                if URL_SCHEME.match(target) or target.startswith("//"):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = path if not file_part else (path.parent / file_part)
                why = target_problem(dest, anchor or None)
                if why:
                    out.append(f"{path.relative_to(REPO)}:{line_of(text, offset + m.start())}: "
                               f"link ({target}) {why}")
        offset += len(line)
    return out


# ---------------------------------------------------------------- the checker itself


def test_slug_follows_github():
    assert github_slug("Dry-run output for examples/glm-5.3-1m.yaml") == \
        "dry-run-output-for-examplesglm-53-1myaml"
    assert github_slug("Objects (CR `glm` in namespace `ns`)") == "objects-cr-glm-in-namespace-ns"
    assert github_slug("NIXL compatibility") == "nixl-compatibility"
    assert github_slug("Ports per role under data parallelism (decision)") == \
        "ports-per-role-under-data-parallelism-decision"


def test_citation_pattern_skips_other_repositories_and_urls():
    text = ("see docs/vllm.md#hisparse, and https://github.com/o/r/blob/main/docs/x.md, "
            "llm-d/llm-d-router:docs/disaggregation.md, ../docs/y.md, mydocs/z.md, docs/*.md, "
            "docs/img/dashboard-<name>.png, docs/benchmarks.md.")
    found = [(m.group("path"), m.group("anchor")) for m in DOCS_CITATION.finditer(text)]
    assert found == [("vllm.md", "hisparse"), ("benchmarks.md.", None)]


def test_checker_reports_a_missing_file_and_a_missing_anchor():
    fake = REPO / "docs" / "design.md"
    # Spelled in pieces so that the repository scan below does not find these in this file.
    missing, bad_anchor = "docs/" + "nowhere.md", "docs/" + "vllm.md#no-such-heading"
    problems = docs_citation_problems(fake, f"{missing} and {bad_anchor}")
    assert len(problems) == 2
    assert f"{missing} does not exist" in problems[0]
    assert f"{bad_anchor} has no heading" in problems[1]
    links = markdown_link_problems(fake, "[a](vllm.md#hisparse) [b](missing.md) "
                                         "[c](https://example.com/x.md) [d](#capacity)")
    assert links == ["docs/design.md:1: link (missing.md) does not exist"]


def test_headings_in_code_blocks_are_not_anchors():
    assert "longctx-engine-defaultglm-roleprefill-podglm-prefill-0-ordinal0-ip100011" \
        not in anchors(REPO / "docs" / "engine.md")


# ---------------------------------------------------------------- the repository


def test_no_file_points_outside_the_repository():
    hits = []
    for path, text in text_files():
        for needle in OUTSIDE:
            for m in re.finditer(re.escape(needle), text):
                hits.append(f"{path.relative_to(REPO)}:{line_of(text, m.start())}: {needle}")
    assert not hits, ("the repository must not cite paths outside it (a user's clone has none); "
                      "write what is needed into docs/ and cite that:\n" + "\n".join(hits))


def test_every_cited_docs_path_and_anchor_exists():
    problems = [p for path, text in text_files() for p in docs_citation_problems(path, text)]
    assert not problems, "cited docs that do not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", sorted(p.relative_to(REPO).as_posix() for p in shipped_files()
                                       if p.suffix == ".md"))
def test_markdown_links_resolve(doc):
    path = REPO / doc
    problems = markdown_link_problems(path, text_of(path) or "")
    assert not problems, "broken links:\n" + "\n".join(problems)
