"""`longctx-engine run`: launch document -> filled for this pod -> pre-checks -> printed
command -> exec."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys

import pytest

from longctx_core import launch
from longctx_engine import entrypoint
from longctx_core.contract import CONFIG_DIR, launch_key
from longctx_engine.precheck import HostProbe
from longctx_core.quantity import GiB
from longctx_core.plan.roles import serving_plan
from longctx_core.vllm_config.recipes import launch_document
from tests.contract.variants import EXAMPLE, REPO, seed_spec as spec_with

ENV = {"POD_NAME": "glm-decode-abc-1", "POD_NAMESPACE": "llm", "POD_IP": "10.2.3.4",
       "VLLM_PORT": "tcp://10.9.9.9:8000", "PATH": "/usr/bin"}


def good_probe():
    return HostProbe(shm_free=lambda: 600 * GiB, mem_available=lambda: 1800 * GiB,
                     gpus=lambda: (8, "test"), vllm_version=lambda: "0.33.0", env={})


def write_document(tmp_path, spec, role="decode"):
    p = tmp_path / launch_key(role)
    p.write_text(launch_document(serving_plan(spec).role(role), "glm", "llm").to_json())
    return str(p)


@pytest.fixture()
def config(tmp_path):
    return write_document(tmp_path, spec_with())


def run(config, dry_run=False, probe=None, env=ENV):
    out, err, calls = io.StringIO(), io.StringIO(), []
    rc = entrypoint.run(config, dry_run, env=env, probe=probe or good_probe(), out=out,
                        err=err, execvpe=lambda *a: calls.append(a))
    return rc, out.getvalue(), err.getvalue(), calls


def test_document_round_trip(config):
    doc = launch.parse(open(config).read())
    assert (doc.deployment, doc.namespace, doc.role) == ("glm", "llm", "decode")
    assert doc.to_json() == open(config).read()
    assert CONFIG_DIR == "/etc/longctx" and launch_key("decode") == "decode.json"


def test_other_format_versions_are_refused_with_both_versions(config):
    raw = json.loads(open(config).read())
    for version in (0, 2, None):
        raw["format_version"] = version
        with pytest.raises(launch.LaunchError) as e:
            launch.parse(json.dumps(raw))
        assert f"format {version!r}" in str(e.value) and "runs format 1" in str(e.value)
        assert "spec.engine.image" in str(e.value)
    raw["format_version"] = 1
    raw["bogus"] = 1
    with pytest.raises(launch.LaunchError, match="bogus"):
        launch.parse(json.dumps(raw))


def test_placeholders_are_filled_per_pod():
    spec = spec_with(lambda d: d["decode"].update(replicas=4, dataParallel=16))
    doc = launch_document(serving_plan(spec).decode, "glm", "llm")
    assert launch.placeholders_used(doc) <= set(launch.PLACEHOLDERS)
    assert "${START_RANK}" in doc.argv and "${POD_IP}" in doc.env.values()
    pod3 = launch.fill(doc, "glm-decode-abc-3", "10.0.0.3")
    assert pod3.argv[pod3.argv.index("--data-parallel-start-rank") + 1] == "8"
    assert pod3.argv[pod3.argv.index("--data-parallel-address") + 1] == \
        "glm-decode-abc-2.glm-decode.llm.svc"
    assert pod3.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(5600 - 8)
    assert not any("${" in a for a in pod3.argv + list(pod3.env.values()))
    with pytest.raises(launch.LaunchError, match="ordinal"):
        launch.fill(doc, "no-ordinal", "10.0.0.3")


def test_run_execs_vllm_with_env(config, monkeypatch):
    monkeypatch.setattr(entrypoint, "prepare_workdir", lambda doc: None)
    rc, out, err, calls = run(config)
    assert rc == 0 and err == ""
    (file, argv, env), = calls
    assert file == "vllm" and argv[:3] == ["vllm", "serve", "zai-org/GLM-5.3-FP8"]
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.2.3.4"
    assert "VLLM_PORT" not in env and env["PATH"] == "/usr/bin"
    assert shlex.join(argv) in out.splitlines()
    assert "export VLLM_NIXL_SIDE_CHANNEL_HOST=10.2.3.4" in out
    assert "[ok] /dev/shm" in out


def test_failed_precheck_stops_the_start(config):
    probe = good_probe()
    probe.shm_free = lambda: 2 * GiB
    rc, out, err, calls = run(config, probe=probe)
    assert rc == 1 and calls == []
    assert "pre-check failed: /dev/shm" in err and "spec.decode.cpuOffloadPerRank" in err


def test_dry_run_prints_and_exits_zero_despite_failures(config):
    probe = good_probe()
    probe.gpus = lambda: (None, "none")
    rc, out, err, calls = run(config, dry_run=True, probe=probe, env={})
    assert rc == 0 and calls == []
    assert "[FAIL] GPUs" in out and "would stop a real start" in out
    assert "vllm serve zai-org/GLM-5.3-FP8" in out


def test_missing_pod_env_and_unreadable_document(config, tmp_path):
    rc, _, err, _ = run(config, env={})
    assert rc == 2 and "POD_IP" in err
    rc, _, err, _ = run(str(tmp_path / "missing.json"))
    assert rc == 2 and "cannot read launch document" in err


def test_prepare_workdir_links_the_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = launch.LaunchDocument(deployment="glm", namespace="llm", role="decode",
                                argv=["vllm"], env={}, vllm_version="0.33.0",
                                workdir=str(tmp_path / "w"),
                                model_links={"org/model": str(tmp_path)})
    entrypoint.prepare_workdir(doc)
    entrypoint.prepare_workdir(doc)   # idempotent on restart
    assert os.readlink(tmp_path / "w" / "org" / "model") == str(tmp_path)
    assert os.getcwd() == str(tmp_path / "w")


def test_cli_dry_run_prints_what_render_wrote(tmp_path):
    """`longctx render --launch ROLE` writes the document; the entrypoint's dry run
    prints exactly the argv that RolePlan.command fills for pod 0."""
    for role in ("prefill", "decode"):
        doc = tmp_path / f"{role}.json"
        r = subprocess.run([sys.executable, "-m", "longctx_operator.cli", "render", "-f",
                            str(EXAMPLE), "--launch", role], capture_output=True, text=True,
                           env={**os.environ})
        assert r.returncode == 0, r.stderr
        doc.write_text(r.stdout)
        r = subprocess.run([sys.executable, "-m", "longctx_engine.entrypoint", "run",
                            str(doc), "--dry-run"], capture_output=True, text=True,
                           env={"PYTHONPATH": f"{REPO / 'core'}:{REPO / 'engine'}",
                                "PATH": os.environ["PATH"]})
        assert r.returncode == 0, r.stderr
        parsed = launch.parse(doc.read_text())
        filled = launch.fill(parsed, f"glm-{role}-0", "127.0.0.1")
        assert shlex.join(filled.argv) in r.stdout.splitlines()
        assert "--kv-transfer-config" in r.stdout


@pytest.mark.parametrize("verdict, started", [(0, True), (1, False)])
def test_preflight_runs_before_vllm_when_asked(tmp_path, verdict, started):
    p = write_document(tmp_path, spec_with(
        lambda d: d.setdefault("engine", {}).__setitem__("preflight", True)))
    out, err, calls, checks = io.StringIO(), io.StringIO(), [], []
    rc = entrypoint.run(p, env=ENV, probe=good_probe(), out=out, err=err,
                        execvpe=lambda *a: calls.append(a),
                        preflight=lambda: checks.append(1) or verdict)
    assert checks == [1]
    assert bool(calls) is started and rc == (0 if started else 1)
    if not started:
        assert "spec.engine.preflight" in err.getvalue()


def test_no_preflight_unless_asked(config):
    rc, out, _, calls = run(config)
    assert rc == 0 and calls and "preflight" not in out


def test_the_entrypoint_imports_no_planner_model_or_api():
    """The pod runs what the operator rendered: the launcher loads no code that could
    compute it again (and so cannot disagree with the operator that rendered it)."""
    code = ("import sys, json; import longctx_engine.entrypoint; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('longctx_'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": f"{REPO / 'core'}:{REPO / 'engine'}"})
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stdout))
    assert loaded == {"longctx_core", "longctx_core.contract", "longctx_core.launch",
                      "longctx_core.quantity", "longctx_engine", "longctx_engine.entrypoint",
                      "longctx_engine.modelinfo", "longctx_engine.precheck"}, loaded
