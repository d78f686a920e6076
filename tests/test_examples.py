"""Every examples/*.yaml through the real `longctx plan` CLI: the verdict each is meant to get,
and the seed's baselines refused at 1M tokens for the reason the seed gives, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
ONE_MILLION = 1048576
FITS, REFUSED = 0, 3  # `longctx plan` exit codes

# What each example is for, and the context it is meant to serve.
INTENDED = {
    "glm-5.3-1m.yaml": ONE_MILLION,                         # the seed deployment
    "glm-5.3-1m-gateway.yaml": ONE_MILLION,                 # the same behind a Gateway
    "glm-5.3-baseline-a-dp8-prefill.yaml": 262144,          # seed baseline A
    "glm-5.3-baseline-b-offload-decode.yaml": 262144,       # seed baseline B
    "deepseek-v3.2-one-node-pair.yaml": 163840,             # first contact, one node pair
    "tiny-mla-cpu.yaml": 2048,                              # no GPUs: vLLM's CPU backend
}


def plan(manifest: dict, tmp_path: Path) -> tuple[int, dict]:
    path = tmp_path / "cr.yaml"
    path.write_text(yaml.safe_dump(manifest))
    proc = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "plan", "-f", str(path),
                           "-o", "json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode in (FITS, REFUSED), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def example(name: str) -> dict:
    (cr,) = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    return cr


def test_every_example_is_listed_with_its_intent():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(INTENDED)


@pytest.mark.parametrize("name", sorted(INTENDED))
def test_example_fits_the_context_it_declares(name, tmp_path):
    cr = example(name)
    assert cr["spec"]["maxContextTokens"] == INTENDED[name]
    rc, report = plan(cr, tmp_path)
    assert rc == FITS and report["fits"], report.get("refusal")
    assert report["prefill"]["fits"] and report["decode"]["fits"]


@pytest.mark.parametrize("name", sorted(INTENDED))
def test_example_fits_with_the_default_host_pool(name, tmp_path):
    """The CRD's default pool (auto) is never one the planner refuses for an example."""
    cr = example(name)
    cr["spec"].get("decode", {}).get("hiSparse", {}).pop("hostPoolPerRank", None)
    rc, report = plan(cr, tmp_path)
    assert rc == FITS and report["fits"], report.get("refusal")
    if report["decode"]["hiSparse"]["enabled"]:
        assert report["decode"]["hiSparse"]["hostPoolRequestsPerRank"] == 1


def at_one_million(name: str, **decode) -> dict:
    cr = example(name)
    cr["spec"]["maxContextTokens"] = ONE_MILLION
    cr["spec"]["decode"].update(decode)
    return cr


@pytest.mark.parametrize("cr, refused_role, fields", [
    # A DP8 prefill rank keeps the whole request's KV on one GPU (behind the 1M example's
    # decode, so that only the prefill is judged).
    (at_one_million("glm-5.3-baseline-a-dp8-prefill.yaml", cpuOffloadPerRank="12Gi",
                    hiSparse={"enabled": True, "hostPoolPerRank": "52Gi"}), "prefill",
     ["spec.prefill", "spec.prefill.contextParallel.decode", "spec.maxContextTokens"]),
    # Offload-only decode: attention reads GPU pages, the offload only keeps copies.
    (at_one_million("glm-5.3-baseline-b-offload-decode.yaml"), "decode",
     ["spec.decode", "spec.decode.cpuOffloadPerRank", "spec.decode.hiSparse.enabled"]),
    # The seed's literal decode split, 48 GiB pool + 16 GiB offload: the pool is short of one
    # 1M-token request, which vLLM refuses at start-up.
    (at_one_million("glm-5.3-1m.yaml", hiSparse={"enabled": True, "hostPoolPerRank": "48Gi"},
                    cpuOffloadPerRank="16Gi"), "decode",
     ["spec.decode.hiSparse.hostPoolPerRank (48Gi)"]),
], ids=["baseline-a", "baseline-b", "seed-48Gi-pool"])
def test_seed_baselines_are_refused_at_one_million_tokens(cr, refused_role, fields, tmp_path):
    rc, report = plan(cr, tmp_path)
    assert rc == REFUSED and not report["fits"]
    other = "decode" if refused_role == "prefill" else "prefill"
    assert not report[refused_role]["fits"] and report[other]["fits"]
    for field in fields:
        assert field in report["refusal"], (field, report["refusal"])


def test_gateway_example_gets_an_httproute_to_its_gateway(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "render", "-f",
                           str(EXAMPLES / "glm-5.3-1m-gateway.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    routes = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "HTTPRoute"]
    (route,) = routes
    gateway = example("glm-5.3-1m-gateway.yaml")["spec"]["router"]["gateway"]
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["name"], parent["namespace"]) == (gateway["name"], gateway["namespace"])
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"][0]["kind"] == "InferencePool"
    # The seed example has no gateway, so no route.
    proc = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "render", "-f",
                           str(EXAMPLES / "glm-5.3-1m.yaml")], capture_output=True, text=True)
    assert not [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "HTTPRoute"]
