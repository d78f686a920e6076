"""Where each metric a dashboard or rule uses is defined: vLLM 0.33's source (installed in the
test environment), the operator's prometheus_client registry, and the Gateway API Inference
Extension endpoint picker's Go source (the module cache). Each returns {metric family: kind}."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import subprocess
from pathlib import Path

GIE_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
GIE_VERSION = "1.5.0"  # tools/build-epp.sh's GIE_VERSION

# The parts of vLLM that define the metrics longctx reads: the engine's stat logger, spec
# decoding, the KV connectors (NIXL, HiSparse, offloading) and the CPU offload manager.
VLLM_METRIC_SOURCES = ("v1/metrics", "v1/spec_decode/metrics.py", "v1/kv_offload/cpu",
                       "distributed/kv_transfer/kv_connector/v1/metrics.py",
                       "distributed/kv_transfer/kv_connector/v1/nixl",
                       "distributed/kv_transfer/kv_connector/v1/hisparse",
                       "distributed/kv_transfer/kv_connector/v1/offloading")

SERIES_SUFFIXES = {"counter": ("_total",), "gauge": ("",),
                   "histogram": ("_bucket", "_sum", "_count")}


def series_names(families: dict[str, str], suffixed: bool) -> dict[str, str]:
    """Sample names a family exposes. prometheus_client appends _total to counters
    (`suffixed`); Go's client library uses a counter's name as given."""
    out = {}
    for name, kind in families.items():
        for suffix in SERIES_SUFFIXES.get(kind, ("",)):
            if kind == "counter" and not suffixed:
                suffix = ""
            out[name + suffix] = kind
    return out


def _kind(call: ast.AST) -> str | None:
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    name = (func.attr if isinstance(func, ast.Attribute) else
            func.id if isinstance(func, ast.Name) else "").lower()
    return next((k for k in ("counter", "gauge", "histogram") if k in name), None)


def vllm_package() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec and spec.origin, ("vLLM is not installed in this Python: run tests with the "
                                  "venv of tools/python-env.sh (vllm==0.33.0)")
    root = Path(spec.origin).parent
    dist = [d.name for d in root.parent.glob("vllm-*.dist-info")]
    assert any(d.startswith("vllm-0.33.") for d in dist), f"the vLLM at {root} is not 0.33: {dist}"
    return root


@functools.cache
def vllm_metrics() -> dict[str, str]:
    """Metric families vLLM registers: `name=` of a Counter/Gauge/Histogram constructor, or a
    dict key / subscript bound to a *Counter*/*Gauge*/*Histogram* metadata object; names may
    be string literals or class/module constants."""
    root = vllm_package()
    paths = [root / sub for sub in VLLM_METRIC_SOURCES]
    missing = [str(p) for p in paths if not p.exists()]
    assert not missing, f"vLLM 0.33's metric sources moved: {missing}"
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py")))]
    trees = [ast.parse(f.read_text(), str(f)) for f in files]
    consts: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            scopes = [node] if isinstance(node, (ast.Module, ast.ClassDef)) else []
            for scope in scopes:
                prefix = f"{scope.name}." if isinstance(scope, ast.ClassDef) else ""
                for stmt in scope.body:
                    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                            and isinstance(stmt.targets[0], ast.Name)
                            and isinstance(stmt.value, ast.Constant)
                            and isinstance(stmt.value.value, str)
                            and stmt.value.value.startswith("vllm:")):
                        consts[prefix + stmt.targets[0].id] = stmt.value.value
                        consts.setdefault(stmt.targets[0].id, stmt.value.value)

    def resolve(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value if node.value.startswith("vllm:") else None
        if isinstance(node, ast.Name):
            return consts.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return consts.get(f"{node.value.id}.{node.attr}") or consts.get(node.attr)
        return None

    found: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            pairs: list[tuple[ast.AST | None, ast.AST]] = []
            if isinstance(node, ast.Call) and _kind(node):
                named = [k.value for k in node.keywords if k.arg == "name"]
                pairs.append((named[0] if named else (node.args[0] if node.args else None),
                              node))
            elif isinstance(node, ast.Dict):
                pairs += zip(node.keys, node.values)
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                pairs.append((node.targets[0].slice, node.value))
            for key, value in pairs:
                name, kind = resolve(key), _kind(value)
                if name and kind:
                    found[name] = kind
            # A constructor fed from a loop over (name, help) tuples of the same function.
            if isinstance(node, ast.FunctionDef):
                for call in ast.walk(node):
                    loop_name = [k.value for k in getattr(call, "keywords", [])
                                 if k.arg == "name" and isinstance(k.value, ast.Name)
                                 and k.value.id not in consts]
                    if _kind(call) and loop_name:
                        for tup in ast.walk(node):
                            if isinstance(tup, ast.Tuple) and tup.elts and resolve(tup.elts[0]):
                                found[resolve(tup.elts[0])] = _kind(call)
    return found


def operator_metrics() -> dict[str, str]:
    """Families in the operator's prometheus_client registry (importing its metrics module)."""
    from prometheus_client import REGISTRY

    import longctx_operator.metrics  # noqa: F401  registers the families

    return {fam.name: fam.type for fam in REGISTRY.collect() if fam.name.startswith("longctx_")
            and not fam.name.startswith("longctx_endpoint_")}


def endpoint_metrics() -> dict[str, str]:
    """Families the client-facing endpoint registers (importing its metrics module)."""
    from prometheus_client import REGISTRY

    import longctx_endpoint.metrics  # noqa: F401  registers the families

    return {fam.name: fam.type for fam in REGISTRY.collect()
            if fam.name.startswith("longctx_endpoint_")}


def gie_module_dir() -> Path:
    proc = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True)
    assert proc.returncode == 0, "go is missing: the picker's metrics are read from its module"
    path = Path(proc.stdout.strip()) / f"{GIE_MODULE}@v{GIE_VERSION}"
    assert path.is_dir(), (
        f"{path} is missing: run tools/build-epp.sh --upstream (or `go mod download "
        f"{GIE_MODULE}@v{GIE_VERSION}`) so the picker's metric names can be checked")
    return path


_GO_OPTS = re.compile(r"prometheus\.New(Counter|Gauge|Histogram|Summary)(?:Vec)?\(\s*"
                      r"prometheus\.\w+Opts\{")


@functools.cache
def picker_metrics() -> dict[str, str]:
    """Families the GIE endpoint picker defines with prometheus.New*Vec(prometheus.*Opts{...})
    in its non-test Go files: [Namespace_][Subsystem_]Name."""
    found: dict[str, str] = {}
    for path in sorted((gie_module_dir() / "pkg").rglob("*.go")):
        if path.name.endswith("_test.go"):
            continue
        src = path.read_text()
        consts = dict(re.findall(r'(\w+)\s*=\s*"([a-z0-9_]*)"', src))
        for m in _GO_OPTS.finditer(src):
            opts = src[m.end():m.end() + 800]
            parts = []
            for field in ("Namespace", "Subsystem"):
                f = re.search(rf'\b{field}:\s*(?:"([^"]*)"|(\w+))', opts.split("Name:")[0])
                if f:
                    parts.append(f.group(1) if f.group(1) is not None else consts[f.group(2)])
            name = re.search(r'\bName:\s*"([^"]+)"', opts)
            if name:
                found["_".join([*filter(None, parts), name.group(1)])] = m.group(1).lower()
    return found
