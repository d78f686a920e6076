"""docs/operator.md's `longctx plan --from` examples (the CLI's output for a decode-only, a
prefill-only and a pairing-key edit of the seed's example) and the pairing key's fields (the
key function's own list), generated.

    python -m tests.rollout_doc            # print the generated section
    python -m tests.rollout_doc --write    # rewrite it in docs/operator.md

tests/operator/test_rollout_cost.py fails when the document differs from the CLI's output.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "operator.md"
EXAMPLE = "examples/glm-5.3-1m.yaml"
SECTION = "rollout-costs"
# (what the edit is, the file name it is shown under, the change to the example's spec)
EDITS = [
    ("a decode-only edit (an extra vLLM flag on decode)", "glm-decode-edit.yaml",
     {"engine": {"extraArgs": {"decode": ["--max-num-seqs", "32"]}}}),
    ("a prefill-only edit", "glm-prefill-edit.yaml",
     {"engine": {"extraArgs": {"prefill": ["--max-num-seqs", "8"]}}}),
    ("a pairing-key edit (a new engine image)", "glm-new-image.yaml",
     {"engine": {"image": "ghcr.io/longctx/engine:0.1.1"}}),
]


def _merged(base: dict, edit: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in edit.items():
        out[key] = _merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def plan_from(edit: dict, base: dict | None = None, output: str = "table") -> str:
    """`longctx plan -f <edited> --from <running> -o output`'s output: the running spec is
    the example's with `base` merged in, the edited one that with `edit` too."""
    from longctx_operator.cli import main

    running = yaml.safe_load((REPO / EXAMPLE).read_text())
    running["spec"] = _merged(running["spec"], base or {})
    edited = copy.deepcopy(running)
    edited["spec"] = _merged(edited["spec"], edit)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / n for n in ("running.yaml", "edited.yaml")]
        for path, cr in zip(paths, (running, edited)):
            path.write_text(yaml.safe_dump(cr))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["plan", "-f", str(paths[1]), "--from", str(paths[0]),
                         "-o", output]) == 0
    return out.getvalue()


def _fields(edit: dict, prefix: str = "spec") -> str:
    """An edit as the spec fields it sets: `spec.engine.image: ...`."""
    return ", ".join(_fields(v, f"{prefix}.{k}") if isinstance(v, dict) else
                     f"`{prefix}.{k}: {json.dumps(v)}`"
                     for k, v in edit.items())


def section() -> str:
    parts = []
    for what, name, edit in EDITS:
        parts += [f"{what[0].upper()}{what[1:]}, {_fields(edit)}:",
                  "", "```", f"$ longctx plan -f {name} --from {EXAMPLE}",
                  plan_from(edit).rstrip(), "```", ""]
    return "\n".join(parts)


def pairing_fields() -> str:
    from longctx_core.plan.revision import pairing_fields as fields

    return "".join(f"- `{f}`\n" for f in fields())


def _replaced(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- BEGIN {name} (generated) -->\n", f"<!-- END {name} -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    assert pattern.search(text), f"docs/operator.md has no {begin.strip()} ... {end} block"
    return pattern.sub(lambda _: begin + body + end, text)


def render(text: str) -> str:
    return _replaced(_replaced(text, SECTION, section()), "pairing-fields", pairing_fields())


if __name__ == "__main__":
    if "--write" in sys.argv:
        DOC.write_text(render(DOC.read_text()))
    else:
        print(section())
