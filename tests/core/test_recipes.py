"""Unit tests of the prefill/decode recipes (no vLLM needed; see tests/contract for vLLM)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from longctx_core import contract
from longctx_core.plan import rules
from longctx_core.quantity import GiB
from longctx_core.plan.roles import role_plan, serving_plan
from longctx_core.plan.rules import RecipeError
from tests.engine_pods import pod, pod_command
from tests.contract.variants import REPO, seed_spec as spec_with

TARGET_PREFILL = (
    "vllm serve zai-org/GLM-5.3-FP8 --served-model-name glm-5.3 --port 8000 "
    "--tensor-parallel-size 1 --prefill-context-parallel-size 8 "
    "--decode-context-parallel-size 8 --dcp-comm-backend ag_rs --enable-expert-parallel "
    "--attention-config '{\"sparse_mla_force_mqa\": true}' --kv-cache-dtype fp8_ds_mla "
    "--max-model-len 1048576 "
    "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' "
    "--kv-transfer-config '{\"kv_connector\":\"MultiConnector\",\"kv_role\":\"kv_producer\","
    "\"kv_connector_extra_config\":{\"connectors\":[{\"kv_connector\":\"NixlConnector\","
    "\"kv_role\":\"kv_producer\",\"kv_connector_extra_config\":{\"backends\":[\"UCX\"],"
    "\"kv_lease_duration\":30}},"
    "{\"kv_connector\":\"OffloadingConnector\",\"kv_role\":\"kv_both\","
    "\"kv_connector_extra_config\":{\"cpu_bytes_to_use\":549755813888}}]}}'")

TARGET_DECODE = (
    "vllm serve zai-org/GLM-5.3-FP8 --served-model-name glm-5.3 --port 8200 "
    "--tensor-parallel-size 1 --data-parallel-size 8 --data-parallel-size-local 8 "
    "--data-parallel-multi-port-external-lb --data-parallel-supervisor-port 8208 "
    "--enable-expert-parallel --kv-cache-dtype fp8_ds_mla --max-model-len 1048576 "
    "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' "
    "--kv-transfer-config '{\"kv_connector\":\"MultiConnector\",\"kv_role\":\"kv_consumer\","
    "\"kv_load_failure_policy\":\"fail\",\"kv_connector_extra_config\":{\"connectors\":[{\"kv_connector\":\"NixlConnector\","
    "\"kv_role\":\"kv_consumer\",\"kv_connector_extra_config\":{\"backends\":[\"UCX\"],"
    "\"kv_lease_duration\":30}},"
    "{\"kv_connector\":\"HiSparseConnector\",\"kv_role\":\"kv_consumer\","
    "\"kv_connector_extra_config\":{\"host_pool_gib\":48}},"
    "{\"kv_connector\":\"OffloadingConnector\",\"kv_role\":\"kv_both\","
    "\"kv_connector_extra_config\":{\"cpu_bytes_to_use\":17179869184}}]}}'")


def kvt(cmd) -> dict:
    return json.loads(cmd.argv[cmd.argv.index("--kv-transfer-config") + 1])


def test_target_commands_match_the_reference():
    spec = spec_with()
    p = pod_command(serving_plan(spec).role("prefill"), pod("prefill"))
    d = pod_command(serving_plan(spec).role("decode"), pod("decode"))
    assert p.shell() == TARGET_PREFILL
    assert d.shell() == TARGET_DECODE
    assert p.argv[:3] == ["vllm", "serve", "zai-org/GLM-5.3-FP8"]
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.0.7"
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert p.env["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"
    assert d.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.1.7"


def test_never_generates_what_the_reference_marks_broken():
    spec = spec_with()
    for role in ("prefill", "decode"):
        cmd = pod_command(serving_plan(spec).role(role), pod(role))
        text = " ".join(cmd.argv)
        assert "--kv-offloading-size" not in text
        assert "engine_id" not in text
        assert "--enable-dbo" not in text
        assert "expandable_segments" not in json.dumps(cmd.env)
        assert cmd.env.get("VLLM_USE_V2_MODEL_RUNNER") != "0"


def test_dp8_prefill_baseline():
    spec = spec_with(lambda d: d["prefill"].update(
        dataParallel=8, contextParallel={"prefill": 1, "decode": 1}, cpuOffloadPerRank="64Gi"))
    cmd = pod_command(serving_plan(spec).role("prefill"), pod("prefill"))
    a = cmd.argv
    assert "--prefill-context-parallel-size" not in a and "--dcp-comm-backend" not in a
    assert a[a.index("--data-parallel-size") + 1] == "8"
    assert a[a.index("--data-parallel-size-local") + 1] == "8"
    assert "--data-parallel-multi-port-external-lb" in a
    assert "--data-parallel-start-rank" not in a
    off = kvt(cmd)["kv_connector_extra_config"]["connectors"][1]
    assert off["kv_connector_extra_config"]["cpu_bytes_to_use"] == 64 * GiB
    ports = role_plan(spec, "prefill").ports
    assert ports.http == list(range(8000, 8008)) and ports.supervisor == 8008
    assert ports.nixl == list(range(5600, 5608))
    assert role_plan(spec, "prefill").memory.shm >= 8 * 64 * GiB


def test_offload_only_decode_has_no_hisparse():
    spec = spec_with(lambda d: d["decode"].update(hiSparse={"enabled": False}))
    cmd = pod_command(serving_plan(spec).role("decode"), pod("decode"))
    names = [c["kv_connector"] for c in kvt(cmd)["kv_connector_extra_config"]["connectors"]]
    assert names == ["NixlConnector", "OffloadingConnector"]
    assert role_plan(spec, "decode").memory.request < role_plan(spec_with(), "decode").memory.request


def test_no_offload_gives_plain_nixl():
    spec = spec_with(lambda d: (d["decode"].update(hiSparse={"enabled": False},
                                                   cpuOffloadPerRank=0)))
    assert kvt(pod_command(serving_plan(spec).role("decode"), pod("decode")))["kv_connector"] == "NixlConnector"


def test_decode_dp_across_pods():
    spec = spec_with(lambda d: d["decode"].update(dataParallel=16, replicas=4))
    for ordinal, start, leader in ((0, 0, 0), (1, 8, 0), (2, 0, 2), (3, 8, 2)):
        cmd = pod_command(serving_plan(spec).role("decode"), pod("decode", ordinal))
        a = cmd.argv
        assert a[a.index("--data-parallel-size") + 1] == "16"
        assert a[a.index("--data-parallel-size-local") + 1] == "8"
        assert a[a.index("--data-parallel-start-rank") + 1] == str(start)
        assert a[a.index("--data-parallel-address") + 1] == \
            f"glm-decode-{leader}.glm-decode.llm.svc"
        assert a[a.index("--data-parallel-rpc-port") + 1] == str(contract.DP_RPC_PORT)
        # NIXL ports stay 5600..5607 on every pod: base shifted by the start rank
        assert int(cmd.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + start == 5600


def test_one_rank_per_pod_uses_external_dp_rank():
    spec = spec_with(lambda d: d["decode"].update(tensorParallel=8, dataParallel=2, replicas=2))
    a = pod_command(serving_plan(spec).role("decode"), pod("decode", 1)).argv
    assert a[a.index("--data-parallel-rank") + 1] == "1"
    assert a[a.index("--data-parallel-size-local") + 1] == "1"
    assert "--data-parallel-multi-port-external-lb" not in a
    assert role_plan(spec, "decode").ports.http == [8200]
    assert role_plan(spec, "decode").ports.supervisor is None


def test_ports_and_sizes_for_the_example():
    spec = spec_with()
    assert role_plan(spec, "prefill").layout.ranks_per_pod == 1
    assert role_plan(spec, "decode").layout.ranks_per_pod == 8
    p, d = role_plan(spec, "prefill").ports, role_plan(spec, "decode").ports
    assert (p.http, p.supervisor, p.nixl) == ([8000], None, [5600])
    assert d.http == list(range(8200, 8208)) and d.supervisor == 8208 and d.health == 8208
    assert d.nixl == list(range(5600, 5608)) and d.serving == list(range(8000, 8008))
    assert role_plan(spec, "prefill").memory.shm == 512 * GiB + 4 * GiB + 8 * GiB
    assert role_plan(spec, "decode").memory.shm == 8 * 16 * GiB + 12 * GiB
    # decode: 8 x (48 HiSparse + 16 offload) + 8 x 12 worker + 8 x 4 rank + 16 pod
    assert role_plan(spec, "decode").memory.request == (8 * 64 + 96 + 32 + 16) * GiB
    assert role_plan(spec, "prefill").memory.request == (512 + 96 + 4 + 16) * GiB


def test_hisparse_device_buffer_and_fractional_pool():
    spec = spec_with(lambda d: d["decode"]["hiSparse"].update(deviceBufferSize=10240,
                                                             hostPoolPerRank="1.5Gi"))
    cmd = pod_command(serving_plan(spec).role("decode"), pod("decode"))
    att = json.loads(cmd.argv[cmd.argv.index("--attention-config") + 1])
    assert att == {"hisparse_config": {"device_buffer_size": 10240}}
    hs = kvt(cmd)["kv_connector_extra_config"]["connectors"][1]
    assert hs["kv_connector_extra_config"]["host_pool_gib"] == 1.5


def test_extra_args_come_last():
    spec = spec_with(lambda d: d["engine"].update(extraArgs={"decode": ["--max-num-seqs", "64"]}))
    assert pod_command(serving_plan(spec).role("decode"), pod("decode")).argv[-2:] == ["--max-num-seqs", "64"]


@pytest.mark.parametrize("arg,field", [
    (["--port", "9000"], "not configurable"),
    (["--port=9000"], "not configurable"),
    (["--tensor_parallel_size", "2"], "spec.decode.tensorParallel"),
    (["-tp", "2"], "spec.decode.tensorParallel"),
    (["-tp=2"], "spec.decode.tensorParallel"),
    (["--max-model-len=4096"], "spec.maxContextTokens"),
    (["--kv-cache-dtype", "auto"], "spec.engine.kvCacheDtype"),
    (["--no-enable-expert-parallel"], "spec.decode.expertParallel"),
    (["--disable-expert-parallel"], "spec.decode.expertParallel"),
    (["--attention-config.sparse_mla_force_mqa", "false"], "attention"),
    (["-sc", "{}"], "spec.engine.speculative"),
    (["--spec-tokens", "2"], "spec.engine.speculative.draftTokens"),
    (["--kv-transfer-config", "{}"], "spec.kvTransfer"),
    (["--data-parallel-size-local", "4"], "gpusPerPod"),
    (["--served_model_name", "x"], "spec.model.servedName"),
])
def test_extra_args_colliding_with_managed_flags_are_refused(arg, field):
    spec = spec_with(lambda d: d["engine"].update(extraArgs={"decode": ["--max-num-seqs", "8",
                                                                        *arg]}))
    with pytest.raises(RecipeError) as e:
        pod_command(serving_plan(spec).role("decode"), pod("decode"))
    msg = str(e.value)
    assert "spec.engine.extraArgs.decode[2]" in msg and field in msg
    assert "remove it" in msg


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["prefill"]["contextParallel"].update(commBackend="a2a"),
     "spec.prefill.contextParallel: commBackend is a2a"),
    (lambda d: d["decode"].update(tensorParallel=2, dataParallel=4,
                                  contextParallel={"decode": 2}),
     "spec.decode: HiSparse cannot run with decode context parallelism (2): set "
     "contextParallel.decode to 1 or hiSparse.enabled to false"),
    (lambda d: d["decode"].update(pipelineParallel=2, dataParallel=4),
     "HiSparse cannot run with pipeline parallelism"),
    (lambda d: d["decode"].update(contextParallel={"prefill": 2}, dataParallel=4),
     "spec.decode: contextParallel.prefill is 2; it must be 1"),
    (lambda d: d["prefill"].update(contextParallel={"prefill": 8, "decode": 4}),
     "contextParallel.decode"),
    (lambda d: d["engine"].update(kvCacheDtype="auto"), "set engine.kvCacheDtype to fp8"),
    (lambda d: d["decode"].update(dataParallel=12), "spec.decode: dataParallel (12)"),
    (lambda d: d["decode"].update(gpusPerPod=8, tensorParallel=16), "gpusPerPod"),
    (lambda d: d["decode"].update(dataParallel=16, replicas=3), "spec.decode: replicas (3)"),
    (lambda d: d["engine"].update(extraArgs={"prefill": ["--kv-offloading-size", "64"]}),
     "spec.prefill.cpuOffloadPerRank"),
    (lambda d: d["engine"].update(extraArgs={"prefill": ["--kv-offloading-backend=native"]}),
     "replaces the NIXL KV connector"),
    (lambda d: d["engine"].update(extraArgs={"decode": ["--enable-dbo"]}), "dual batch overlap"),
    (lambda d: d["engine"].update(extraArgs={"prefill": ["--ubatch-size", "2"]}),
     "dual batch overlap"),
    (lambda d: d["engine"].update(extraArgs={"decode": ["--no-scheduler-reserve-full-isl"]}),
     "--scheduler-reserve-full-isl"),
    (lambda d: d["engine"].update(extraArgs={"decode": ["-cc", '{"cudagraph_mode": "FULL"}']}),
     "HiSparse"),
    (lambda d: d["engine"].update(extraArgs={"prefill": ["--enable-return-routed-experts"]}),
     "context parallelism"),
    (lambda d: d["engine"].update(extraArgs={"prefill": ["--no-enable-hybrid-kv-cache-manager"]}),
     "hybrid KV cache manager"),
])
def test_known_bad_combinations_are_refused(edit, needle):
    spec = spec_with(edit)
    with pytest.raises(RecipeError) as e:
        rules.validate(spec)
    assert needle in str(e.value)


def test_allowed_extra_args_pass():
    spec = spec_with(lambda d: d["engine"].update(extraArgs={
        "decode": ["--enable-hybrid-kv-cache-manager", "-cc.cudagraph_mode=FULL_DECODE_ONLY",
                   "--kv-events-config", '{"enable_kv_cache_events": true}'],
        "prefill": ["--gpu-memory-utilization", "0.9"]}))
    rules.validate(spec)


def test_bad_role():
    with pytest.raises(RecipeError, match="role"):
        pod_command(serving_plan(spec_with()).role("encode"), pod("decode"))


def test_pvc_model_is_linked_not_renamed():
    cmd = pod_command(serving_plan(spec_with()).role("decode"), pod("decode"))
    assert cmd.argv[2] == "zai-org/GLM-5.3-FP8"
    assert cmd.symlinks == {"zai-org/GLM-5.3-FP8": "/models"} and cmd.workdir
    hf = spec_with(lambda d: d["model"].update(source={"huggingFace": {}}))
    cmd = pod_command(serving_plan(hf).role("decode"), pod("decode"))
    assert cmd.workdir is None and "HF_HUB_OFFLINE" not in cmd.env


def test_container_command_is_the_console_script():
    assert list(contract.ENGINE_CONTAINER_COMMAND) == ["longctx-engine", "run"]
    text = (REPO / "pyproject.toml").read_text()
    assert 'longctx-engine = "longctx_engine.entrypoint:main"' in text


def test_engine_package_imports_neither_vllm_nor_torch():
    code = ("import sys; import longctx_core.vllm_config.recipes, longctx_core.vllm_config.compat, "
            "longctx_engine.precheck, longctx_engine.entrypoint; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": f"{REPO / 'core'}:{REPO / 'engine'}"})
    assert r.returncode == 0, r.stdout + r.stderr


def test_operator_package_imports_neither_vllm_nor_torch():
    """Importing the operator package (and what it imports) loads neither vllm nor torch."""
    mods = sorted(p.stem for p in (REPO / "operator" / "longctx_operator").glob("*.py"))
    imports = "; ".join(f"import longctx_operator.{m}" for m in mods if m != "__main__")
    code = (f"import sys; import longctx_operator; {imports}; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    path = ":".join(str(REPO / d) for d in ("core", "operator"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": path})
    assert r.returncode == 0, r.stdout + r.stderr


def test_shell_quoting_round_trips():
    cmd = pod_command(serving_plan(spec_with()).role("prefill"), pod("prefill"))
    assert shlex.split(cmd.shell()) == cmd.argv


def test_mtp_rules_from_the_architecture():
    def arch(mtp):
        def edit(d):
            d["model"].pop("preset")
            d["model"]["architecture"] = {"layers": 78, "mtpLayers": mtp, "attentionHeads": 64,
                                          "kvLoraRank": 512, "qkRopeHeadDim": 64}
        return edit
    rules.validate(spec_with(arch(1)))
    with pytest.raises(RecipeError, match="no MTP layers"):
        rules.validate(spec_with(arch(0)))
    with pytest.raises(RecipeError, match="single-module MTP"):
        rules.validate(spec_with(arch(2)))
    def one_draft(d):
        arch(2)(d)
        d["engine"]["speculative"] = {"method": "mtp", "draftTokens": 1}
    rules.validate(spec_with(one_draft))
