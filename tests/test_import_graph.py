"""No import cycles inside the project's packages: every import (at module level, in a
function, or under TYPE_CHECKING) of every module is an edge, and each strongly connected
component of the graph must be a single module. A cycle works only while the import order
happens to suit it, and makes the modules in it one unit that cannot be tested apart."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"longctx_operator": REPO / "operator", "longctx_endpoint": REPO / "operator",
            "longctx_core": REPO / "core", "longctx_engine": REPO / "engine",
            "longctx_kernels": REPO / "kernels"}


def modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, relative imports resolved. `from a import b`
    names module a.b when there is one, else a itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walker_sees_a_cycle_and_resolves_relative_imports():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    known = modules()
    edges = imports("longctx_operator.controller.reconcile", known["longctx_operator.controller.reconcile"], known)
    assert {"longctx_operator.controller.rollout", "longctx_operator.controller.cluster",
            "longctx_core.contract"} <= edges


def test_no_import_cycles():
    known = modules()
    assert len(known) > 30, sorted(known)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} imports {b}" for a in c
                                           for b in sorted(graph[a] & set(c))) + ")"
        for c in found)


def package_of(module: str) -> str:
    """The subpackage a module belongs to (longctx_core.sizing), or the module itself when
    it sits at a package's top (longctx_core.contract)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_import_cycles_between_packages():
    """Packages, not only modules: sizing, plan, vllm_config, launcher, controller, runtime
    and the others form layers, so each can be read and tested without those above it."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        graph.setdefault(package_of(name), set()).update(
            package_of(m) for m in imports(name, path, known))
    for package, edges in graph.items():
        edges.discard(package)
    found = cycles(graph)
    assert not found, "package import cycles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(
            f"{a}.{m.rpartition('.')[2]} imports {b}" for a in c for b in c if a != b
            for m, p in known.items() if package_of(m) == a
            and any(package_of(i) == b for i in imports(m, p, known))) + ")"
        for c in found)


def test_the_engine_pod_and_the_control_plane_share_only_the_core():
    """engine/ (what runs in an engine pod) and operator/ (the control plane) both build on
    core/ and never on each other; core imports neither."""
    known = modules()
    top = {name: {m.partition(".")[0] for m in imports(name, path, known)}
           for name, path in known.items()}
    allowed = {"longctx_core": {"longctx_core"},
               "longctx_engine": {"longctx_core", "longctx_engine"},
               "longctx_operator": {"longctx_core", "longctx_operator"}}
    wrong = {name: sorted(used - allowed[name.partition(".")[0]])
             for name, used in top.items() if name.partition(".")[0] in allowed
             and used - allowed[name.partition(".")[0]]}
    assert not wrong, wrong
