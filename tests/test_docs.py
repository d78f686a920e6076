"""The repository is self-contained: nothing points outside it, and every `docs/...` path or
Markdown link it cites exists, down to the heading an `#anchor` names.

A user's clone has only the repository, so a citation of a sibling folder or of a document
that was never written is a dead end. Files are the ones git would ship: tracked and
untracked-but-not-ignored, text only.
"""

from __future__ import annotations

import ast
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


# ---------------------------------------------------------------- names the docs use
#
# A user reads docs/*.md and README.md against the code: every file they name must exist
# (in the repository, or in vLLM, whose files they quote), and every backticked Python name
# must be defined. A Kubernetes field path (`spec.decode.replicas`) is not a Python name:
# only names whose first part is one of the project's modules, and calls, are checked.

USER_DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
# A file name: a path-like token ending in a source extension, not inside a URL, a longer
# path or a template (`docs/*.md`, `dashboard-<name>.png`).
FILE_NAME = re.compile(r"(?<![\w./:@*<>{}$-])(?P<path>[\w./-]*\w\.(?:py|sh|cu|cuh))(?![\w/<*{-])")
CODE_SPAN = re.compile(r"`(?P<code>[^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
CALL = re.compile(r"(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\(")
# Roots that are fields of a CR or of `longctx plan`'s output in prose, though a module
# shares the name; a camelCase part, or a file extension at the end, also marks a non-Python
# name (`rbac.clusterScopedReads`, `engine.yaml`).
FIELD_ROOTS = {"spec", "status", "metadata", "performance"}
NOT_PYTHON = re.compile(r"[a-z][A-Z]|\.(?:ya?ml|json|md|txt|png|toml|sum|mod)$")
# Packages whose files the docs quote (vLLM's sources, as installed in the environment).
FOREIGN_PACKAGES = ("vllm",)


@lru_cache(maxsize=None)
def source_paths() -> tuple[str, ...]:
    """Every shipped file, and every file of the foreign packages, as POSIX paths."""
    import sysconfig

    paths = [p.relative_to(REPO).as_posix() for p in shipped_files()]
    site = Path(sysconfig.get_paths()["purelib"])
    for package in FOREIGN_PACKAGES:
        paths += [p.relative_to(site).as_posix() for p in (site / package).rglob("*")
                  if p.suffix in (".py", ".cu", ".cuh", ".sh")]
    return tuple(paths)


def file_exists(name: str) -> bool:
    name = name.lstrip("./")
    if name.rsplit("/", 1)[-1].count(".") > 1:
        return True   # a domain (`scaledobjects.keda.sh`), not a file name
    return any(p == name or p.endswith("/" + name) for p in source_paths())


@lru_cache(maxsize=None)
def modules() -> dict[str, tuple[ast.Module, ...]]:
    """The project's Python modules by every dotted suffix of their name (`router`,
    `builders.router`, `longctx_operator.controller.builders.router`), parsed."""
    out: dict[str, list[ast.Module]] = {}
    for path in shipped_files():
        if path.suffix != ".py":
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        for i in range(len(parts)):
            out.setdefault(".".join(parts[i:]), []).append(tree)
    return {k: tuple(v) for k, v in out.items()}


def defined(scope: ast.AST) -> dict[str, ast.AST]:
    """The names a module or class body defines, with their nodes."""
    names: dict[str, ast.AST] = {}
    # Only statement lists: an expression's `body` (a lambda's, an IfExp's) defines nothing.
    nodes = [n for field in ("body", "orelse") for n in (
        getattr(scope, field, None) if isinstance(getattr(scope, field, None), list) else [])]
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names[n.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, (ast.If, ast.Try)):
            names.update(defined(node))
    return names


def resolves(parts: list[str]) -> bool:
    """Whether a project module (the longest dotted prefix that names one) defines the
    rest: a function, class, constant, or a class's member. A module's own name resolves."""
    if ".".join(parts) in modules():
        return True
    for i in range(len(parts) - 1, 0, -1):
        for tree in modules().get(".".join(parts[:i]), ()):
            scope: ast.AST = tree
            for name in parts[i:]:
                node = defined(scope).get(name)
                if node is None:
                    break
                scope = node
            else:
                return True
    return False


@lru_cache(maxsize=None)
def defined_anywhere() -> frozenset[str]:
    return frozenset(name for trees in modules().values() for tree in trees
                     for node in ast.walk(tree) for name in defined(node))


def name_problem(name: str, call: bool) -> str | None:
    """Why a backticked Python name (`call`: called) does not resolve, or None."""
    import builtins
    import math
    import sys

    parts = name.split(".")
    if NOT_PYTHON.search(name):
        return None
    if len(parts) == 1:
        known = parts[0] in defined_anywhere() or hasattr(builtins, parts[0]) or \
            hasattr(math, parts[0])
        return None if known else "is defined nowhere in the repository"
    if parts[0] in sys.stdlib_module_names and call:
        import importlib
        obj: object = importlib.import_module(parts[0])
        for p in parts[1:]:
            obj = getattr(obj, p, None)
        return None if obj is not None else "is not in the standard library"
    if parts[0] in modules() and parts[0] not in FIELD_ROOTS:
        return None if resolves(parts) else f"is not defined in module {parts[0]}"
    return None   # another package's name, or a field path: not checked


def doc_name_problems(path: Path, text: str) -> list[str]:
    out = []
    where = lambda offset: f"{path.relative_to(REPO)}:{line_of(text, offset)}"  # noqa: E731
    for m in FILE_NAME.finditer(text):
        if not file_exists(m.group("path")):
            out.append(f"{where(m.start())}: {m.group('path')} does not exist")
    for m in CODE_SPAN.finditer(text):
        code = m.group("code")
        calls = [c.group("name") for c in CALL.finditer(code)]
        if calls:
            name, call = calls[0], True   # the callee; what follows is its result's
        elif DOTTED.fullmatch(code) and not FILE_NAME.search(code):
            name, call = code, False
        else:
            continue
        why = name_problem(name, call)
        if why:
            out.append(f"{where(m.start())}: `{name}` {why}")
    return out


def test_the_name_checker_finds_what_is_missing_and_passes_what_exists():
    fake = REPO / "docs" / "engine.md"
    missing = "longctx_core/" + "nowhere.py"
    text = (f"`{missing}`, kernels/longctx_kernels/lse_merge.py, `csrc/radix_topk.cu`, "
            "`deepseek_v2.py`, `revision.pairing_key`, `revision.no_such_function`, "
            "`spec.decode.replicas`, `status.plan`, `getpass.getuser()`, `no_such_helper(x)`, "
            "`kinds.Kind.wave`, https://example.com/x/gone.py")
    problems = [p.split(": ", 1)[1] for p in doc_name_problems(fake, text)]
    assert problems == [f"{missing} does not exist",
                        "`revision.no_such_function` is not defined in module revision",
                        "`no_such_helper` is defined nowhere in the repository"]


@pytest.mark.parametrize("doc", [p.relative_to(REPO).as_posix() for p in USER_DOCS])
def test_docs_name_only_files_and_python_names_that_exist(doc):
    path = REPO / doc
    problems = doc_name_problems(path, text_of(path) or "")
    assert not problems, "stale names:\n" + "\n".join(problems)
