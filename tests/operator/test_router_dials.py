"""Every address a component dials has a listener, read from the rendering
(tests/router_dials.py), and docs/router.md's tables are that rendering."""

from __future__ import annotations

import json

import pytest

from longctx_core import contract
from tests import router_dials as dials


@pytest.mark.parametrize("example", sorted(p.name for p in (dials.REPO / "examples").glob("*.yaml")))
@pytest.mark.parametrize("router_type", ["llm-d", "vllm-router"])
def test_every_dial_of_every_example_has_a_listener(example, router_type):
    objects = dials.rendered(dials.example(example, router_type))
    listeners, made = dials.addresses(objects)
    servers = {d.server for d in made}
    assert {dials.engine("prefill"), dials.engine("decode") if router_type == "vllm-router"
            else dials.SIDECAR} <= servers
    assert dials.unanswered(objects) == []


def test_an_engine_bound_to_the_pod_ip_leaves_the_sidecar_unanswered():
    """What the check catches: vLLM on the pod IP only, as the CPU recipe once rendered it,
    cannot be reached by llm-d's sidecar, which dials loopback."""
    objects = dials.rendered(dials.example("tiny-mla-cpu.yaml", "llm-d"))
    for obj in objects:
        key = contract.launch_key("decode")
        if obj["kind"] == "ConfigMap" and key in (obj.get("data") or {}):
            doc = json.loads(obj["data"][key])
            doc["argv"] += ["--host", f"${{{contract.ENV_POD_IP}}}"]
            obj["data"][key] = json.dumps(doc)
    (missing,) = dials.unanswered(objects)
    assert (missing.client, missing.server, missing.host) == (
        dials.SIDECAR, dials.engine("decode"), dials.LOOPBACK)


def test_the_router_doc_lists_the_rendered_dials():
    text = dials.DOC.read_text()
    assert text == dials.doc_with_section(text), \
        "docs/router.md differs from the rendering: run python -m tests.router_dials --write"
