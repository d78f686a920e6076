"""`longctx-engine run`: config -> identity -> pre-checks -> printed command -> exec."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys

import pytest

from longctx_engine import entrypoint
from longctx_engine.contract import CONFIG_DIR, CONFIG_KEY
from longctx_engine.engine_config import (EngineConfigError, parse_engine_config,
                                          read_engine_config, render_engine_config)
from longctx_engine.precheck import HostProbe
from longctx_engine.quantity import GiB
from tests.contract.variants import EXAMPLE, REPO, seed_spec as spec_with

ENV = {"POD_NAME": "glm-decode-1", "POD_NAMESPACE": "llm", "POD_IP": "10.2.3.4",
       "VLLM_PORT": "tcp://10.9.9.9:8000", "PATH": "/usr/bin"}


def good_probe():
    return HostProbe(shm_free=lambda: 600 * GiB, mem_available=lambda: 1800 * GiB,
                     gpus=lambda: (8, "test"), vllm_version=lambda: "0.33.0", env={})


@pytest.fixture()
def config(tmp_path):
    p = tmp_path / CONFIG_KEY
    p.write_text(render_engine_config("glm", "llm", spec_with()))
    return str(p)


def run(config, role="decode", dry_run=False, probe=None, env=ENV):
    out, err, calls = io.StringIO(), io.StringIO(), []
    rc = entrypoint.run(role, config, dry_run, env=env, probe=probe or good_probe(), out=out,
                        err=err, execvpe=lambda *a: calls.append(a))
    return rc, out.getvalue(), err.getvalue(), calls


def test_engine_config_round_trip(config):
    cfg = read_engine_config(config)
    assert (cfg.cr_name, cfg.namespace) == ("glm", "llm")
    assert cfg.spec == spec_with()
    assert render_engine_config("glm", "llm", cfg.spec) == open(config).read()
    assert CONFIG_DIR == "/etc/longctx" and CONFIG_KEY == "engine.yaml"


def test_engine_config_accepts_manifest_and_configmap(config):
    assert read_engine_config(EXAMPLE).cr_name == "glm"
    import yaml
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "glm-engine"},
          "data": {CONFIG_KEY: open(config).read()}}
    assert parse_engine_config(yaml.safe_dump(cm)).namespace == "llm"
    with pytest.raises(EngineConfigError, match="unknown field.*bogus"):
        parse_engine_config("name: x\nspec: {bogus: 1, model: {}}")
    with pytest.raises(EngineConfigError, match="cannot read"):
        read_engine_config("/nonexistent/engine.yaml")


def test_run_execs_vllm_with_env(config, monkeypatch):
    monkeypatch.setattr(entrypoint, "prepare_workdir", lambda cmd: None)
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


def test_missing_pod_env_and_bad_spec(config, tmp_path):
    rc, _, err, _ = run(config, env={})
    assert rc == 2 and "POD_IP" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(render_engine_config("glm", "llm", spec_with(
        lambda d: d["prefill"]["contextParallel"].update(commBackend="a2a"))))
    rc, _, err, _ = run(str(bad), role="prefill")
    assert rc == 2 and "commBackend" in err


def test_prepare_workdir_links_the_model(tmp_path, monkeypatch):
    from longctx_engine.recipes import EngineCommand
    monkeypatch.chdir(tmp_path)
    cmd = EngineCommand(argv=["vllm"], env={}, workdir=str(tmp_path / "w"),
                        symlinks={"org/model": str(tmp_path)})
    entrypoint.prepare_workdir(cmd)
    entrypoint.prepare_workdir(cmd)   # idempotent on restart
    assert os.readlink(tmp_path / "w" / "org" / "model") == str(tmp_path)
    assert os.getcwd() == str(tmp_path / "w")


def test_cli_dry_run_for_the_example():
    for role in ("prefill", "decode"):
        r = subprocess.run([sys.executable, "-m", "longctx_engine.entrypoint", "run", "--role",
                            role, "--config", str(EXAMPLE), "--dry-run"],
                           capture_output=True, text=True,
                           env={"PYTHONPATH": str(REPO / "engine"), "PATH": os.environ["PATH"]})
        assert r.returncode == 0, r.stderr
        assert "vllm serve zai-org/GLM-5.3-FP8" in r.stdout
        assert "--kv-transfer-config" in r.stdout


def test_engine_config_from_longctx_render_stream(config):
    import yaml
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "glm-engine"},
          "data": {CONFIG_KEY: open(config).read()}}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "glm-epp"},
             "data": {"x": "y"}}
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "glm-decode"}}
    cfg = parse_engine_config(yaml.safe_dump_all([sts, other, cm, None]))
    assert (cfg.cr_name, cfg.namespace) == ("glm", "llm")
    with pytest.raises(EngineConfigError, match="exactly one"):
        parse_engine_config(yaml.safe_dump_all([cm, cm]))


@pytest.mark.parametrize("verdict, started", [(0, True), (1, False)])
def test_preflight_runs_before_vllm_when_asked(tmp_path, verdict, started):
    p = tmp_path / CONFIG_KEY
    p.write_text(render_engine_config("glm", "llm", spec_with(
        lambda d: d.setdefault("engine", {}).__setitem__("preflight", True))))
    out, err, calls, checks = io.StringIO(), io.StringIO(), [], []
    rc = entrypoint.run("decode", str(p), env=ENV, probe=good_probe(), out=out, err=err,
                        execvpe=lambda *a: calls.append(a),
                        preflight=lambda: checks.append(1) or verdict)
    assert checks == [1]
    assert bool(calls) is started and rc == (0 if started else 1)
    if not started:
        assert "spec.engine.preflight" in err.getvalue()


def test_no_preflight_unless_asked(config):
    rc, out, _, calls = run(config)
    assert rc == 0 and calls and "preflight" not in out
