"""Contract tests: every generated command line goes through the real vLLM 0.33.0.

Tier 1: `vllm serve`'s own parser, `validate_parsed_serve_args` and
`AsyncEngineArgs.from_cli_args` (what `vllm serve` does up to engine-config creation).
Tier 2: the config objects vLLM builds and validates without a GPU: ParallelConfig (per
multi-port child rank, as vLLM's DP supervisor derives it), KVTransferConfig and each
MultiConnector child, HiSparse pool parsing, HMA support, AttentionConfig, and the
speculative JSON against SpeculativeConfig's field validation.
Negative tests show vLLM itself rejects bad values, and that our own validation refuses
known-bad combinations before any engine starts.
"""

from __future__ import annotations

import json

import pytest

from longctx_core.plan import rules
from longctx_core.plan import extra_args
from longctx_core.vllm_config.compat import pd_compatibility
from longctx_core.plan.roles import role_plan, serving_plan
from longctx_core.plan.rules import RecipeError

from .variants import VARIANTS, Variant, spec_with
from tests.engine_pods import pod, pod_command


def parse(vllm, argv: list[str]):
    """Tier 1 exactly as `vllm serve` runs it; returns (args, AsyncEngineArgs)."""
    assert argv[:2] == ["vllm", "serve"]
    args = vllm.parser.parse_args(argv[2:])
    vllm.validate_parsed_serve_args(args)
    args.model = args.model_tag
    return args, vllm.AsyncEngineArgs.from_cli_args(args)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def child_args(vllm, args, local_rank: int):
    """What vLLM's multi-port DP supervisor gives rank `local_rank` of this pod."""
    if not args.data_parallel_multi_port_external_lb:
        return args
    return vllm.dp_supervisor._build_vllm_dp_server_args(args, local_rank)


def parallel_config(vllm, ea):
    return vllm.ParallelConfig(
        tensor_parallel_size=ea.tensor_parallel_size,
        pipeline_parallel_size=ea.pipeline_parallel_size,
        prefill_context_parallel_size=ea.prefill_context_parallel_size,
        decode_context_parallel_size=ea.decode_context_parallel_size,
        dcp_comm_backend=ea.dcp_comm_backend,
        enable_expert_parallel=ea.enable_expert_parallel,
        data_parallel_size=ea.data_parallel_size,
        data_parallel_size_local=ea.data_parallel_size_local or ea.data_parallel_size,
        data_parallel_rank=ea.data_parallel_rank or 0,
        data_parallel_external_lb=bool(ea.data_parallel_external_lb),
        distributed_executor_backend="mp")


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: v.id)
def variant(request) -> Variant:
    return request.param


# ------------------------------------------------------------------ tier 1


def test_tier1_parse_validate_engine_args(vllm, variant: Variant):
    cmd = variant.command()
    args, ea = parse(vllm, cmd.argv)
    spec = variant.spec()
    lay = role_plan(spec, variant.role).layout
    assert args.model_tag == ea.model == spec.model.name
    assert ea.max_model_len == spec.maxContextTokens
    assert ea.kv_cache_dtype == "fp8_ds_mla"
    assert ea.tensor_parallel_size == lay.tensorParallel
    assert ea.prefill_context_parallel_size == lay.prefillContextParallel
    assert ea.decode_context_parallel_size == lay.decodeContextParallel
    assert ea.data_parallel_size == lay.dataParallel
    assert ea.enable_expert_parallel is True
    assert ea.served_model_name in ("glm-5.3", ["glm-5.3"])
    assert ea.kv_transfer_config.kv_connector in ("MultiConnector", "NixlConnector")
    assert ea.kv_transfer_config.kv_role == (
        "kv_producer" if variant.role == "prefill" else "kv_consumer")
    assert ea.speculative_config == {"method": "mtp", "num_speculative_tokens": 3}
    assert ea.kv_offloading_size is None, "never --kv-offloading-size with NIXL"
    assert ea.enable_dbo is False
    assert ea.disable_hybrid_kv_cache_manager in (None, False)
    ports = role_plan(spec, variant.role).ports
    assert args.port == ports.http[0]
    if ports.supervisor is not None:
        assert args.data_parallel_multi_port_external_lb
        assert args.data_parallel_supervisor_port == ports.supervisor
    if variant.role == "prefill":
        assert ea.attention_config.sparse_mla_force_mqa is True
    if lay.prefillContextParallel > 1 and lay.decodeContextParallel > 1:
        assert ea.dcp_comm_backend == "ag_rs"


def test_tier1_multiport_children_get_the_right_ranks_and_ports(vllm, variant: Variant):
    cmd = variant.command()
    args, _ = parse(vllm, cmd.argv)
    spec = variant.spec()
    lay = role_plan(spec, variant.role).layout
    ports = role_plan(spec, variant.role).ports
    # The pod's first global rank, as the launcher fills ${START_RANK}.
    first = (variant.ordinal % lay.pods_per_group) * lay.ranks_per_pod
    for i in range(lay.ranks_per_pod):
        c = child_args(vllm, args, i)
        c.model = c.model_tag
        ea = vllm.AsyncEngineArgs.from_cli_args(c)
        pc = parallel_config(vllm, ea)
        assert pc.world_size == lay.gpus_per_rank
        if lay.dataParallel > 1:
            assert pc.data_parallel_rank == first + i
            assert c.port == ports.http[i]
            # NIXL listens on VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index
            assert int(cmd.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + pc.data_parallel_index \
                == ports.nixl[i]
        else:
            assert int(cmd.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ports.nixl[0]


# ------------------------------------------------------------------ tier 2


def test_tier2_kv_transfer_and_children(vllm, variant: Variant):
    cmd = variant.command()
    raw = json.loads(flag(cmd.argv, "--kv-transfer-config"))
    top = vllm.KVTransferConfig(**raw)
    children = raw["kv_connector_extra_config"].get("connectors", [raw]) \
        if raw["kv_connector"] == "MultiConnector" else [raw]
    for child in children:
        assert "engine_id" not in child
        vllm.KVTransferConfig(**child)
    names = [c["kv_connector"] for c in children]
    assert names[0] == "NixlConnector"
    assert vllm.KVConnectorFactory.supports_hma_config(top) is True
    spec = variant.spec()
    plan = role_plan(spec, variant.role)
    memory = plan.memory
    if plan.hisparse:
        assert vllm.hisparse_host_pool_gib(top) * 2**30 == plan.capacity.hisparse_pool_bytes
    else:
        assert "HiSparseConnector" not in names
    if "OffloadingConnector" in names:
        off = children[names.index("OffloadingConnector")]
        assert off["kv_connector_extra_config"]["cpu_bytes_to_use"] == memory.offload_per_rank


def test_tier2_attention_and_speculative(vllm, variant: Variant):
    cmd = variant.command()
    if "--attention-config" in cmd.argv:
        vllm.AttentionConfig(**json.loads(flag(cmd.argv, "--attention-config")))
    sc = json.loads(flag(cmd.argv, "--speculative-config"))
    # Every field validates; only the target model (not available offline) is missing.
    with pytest.raises(Exception, match="target_model_config must be present for mtp"):
        vllm.SpeculativeConfig(**sc)


def test_tier2_parallel_config(vllm, variant: Variant):
    args, ea = parse(vllm, variant.command().argv)
    ea = vllm.AsyncEngineArgs.from_cli_args(child_args(vllm, args, 0)) \
        if args.data_parallel_multi_port_external_lb else ea
    pc = parallel_config(vllm, ea)
    lay = role_plan(variant.spec(), variant.role).layout
    assert pc.world_size == lay.tensorParallel * lay.pipelineParallel * lay.prefillContextParallel
    assert pc.decode_context_parallel_size == lay.decodeContextParallel


def test_target_pair_is_nixl_compatible():
    spec = spec_with()
    plan = serving_plan(spec)
    p = pod_command(plan.prefill, pod("prefill"))
    d = pod_command(plan.decode, pod("decode"))
    assert pd_compatibility(p, d) == []


# ------------------------------------------------------------------ vLLM rejects


def test_vllm_rejects_bad_dcp_backend(vllm):
    argv = VARIANTS[0].command().argv
    argv[argv.index("--dcp-comm-backend") + 1] = "bogus"
    with pytest.raises(SystemExit) as e:
        vllm.make_parser().parse_args(argv[2:])
    assert e.value.code == 2


def test_vllm_rejects_bad_kv_role_and_unknown_key(vllm):
    argv = VARIANTS[1].command().argv
    bad = json.loads(flag(argv, "--kv-transfer-config"))
    bad["kv_connector_extra_config"]["connectors"][0]["kv_role"] = "kv_sender"
    with pytest.raises(Exception, match="kv_role"):
        vllm.KVTransferConfig(**bad["kv_connector_extra_config"]["connectors"][0])
    i = argv.index("--kv-transfer-config") + 1
    argv[i] = json.dumps({**json.loads(argv[i]), "kv_conector_typo": 1})
    with pytest.raises((SystemExit, Exception)):
        vllm.make_parser().parse_args(argv[2:])


def test_vllm_rejects_engine_id_inside_multiconnector_child(vllm):
    """Why the recipes never write engine_id in a child: MultiConnector passes its own."""
    child = {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "engine_id": "x"}
    with pytest.raises(TypeError, match="engine_id"):
        vllm.KVTransferConfig(**child, engine_id="y")


def test_vllm_rejects_bad_parallel_layout(vllm):
    with pytest.raises(Exception, match="DCP"):
        vllm.ParallelConfig(tensor_parallel_size=1, prefill_context_parallel_size=8,
                            decode_context_parallel_size=16, dcp_comm_backend="ag_rs",
                            enable_expert_parallel=True, distributed_executor_backend="mp")


def test_vllm_rejects_hisparse_without_pool_and_bad_attention_key(vllm):
    cfg = vllm.KVTransferConfig(kv_connector="HiSparseConnector", kv_role="kv_consumer",
                                kv_connector_extra_config={})
    with pytest.raises(ValueError, match="requires host_pool_gib"):
        vllm.hisparse_host_pool_gib(cfg)
    with pytest.raises(Exception):
        vllm.AttentionConfig(sparse_mla_force_mqa=True, no_such_key=1)


def test_vllm_rejects_supervisor_port_overlap(vllm):
    argv = VARIANTS[1].command().argv
    argv[argv.index("--data-parallel-supervisor-port") + 1] = "8203"
    args = vllm.make_parser().parse_args(argv[2:])
    with pytest.raises(ValueError, match="overlaps"):
        vllm.validate_parsed_serve_args(args)


def test_vllm_rejects_zero_draft_tokens(vllm):
    with pytest.raises(Exception, match="greater than 0"):
        vllm.SpeculativeConfig(method="mtp", num_speculative_tokens=0)


# ------------------------------------------------------------------ our refusals


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["prefill"]["contextParallel"].update(commBackend="a2a"), "ag_rs"),
    (lambda d: d["decode"].update(tensorParallel=2, dataParallel=4,
                                  contextParallel={"decode": 2}), "HiSparse"),
    (lambda d: d["engine"].update(extraArgs={"prefill": ["--kv-offloading-size", "64"]}),
     "kv-offloading-size"),
    (lambda d: d["engine"].update(extraArgs={"decode": ["--kv_offloading_size=64"]}),
     "kv-offloading-size"),
    (lambda d: d["engine"].update(extraArgs={"decode": ["--enable-dbo"]}), "dual batch"),
    (lambda d: d["engine"].update(extraArgs={"prefill": ["-cc.cudagraph_mode=FULL"]}),
     "cudagraph_mode=FULL"),
    (lambda d: d["engine"].update(extraArgs={"decode": ["--disable-hybrid-kv-cache-manager"]}),
     "hybrid KV cache manager"),
])
def test_recipes_refuse_known_bad_combinations(edit, needle):
    with pytest.raises(RecipeError, match=needle):
        rules.validate(spec_with(edit))


def test_vllm_does_not_catch_what_we_refuse(vllm):
    """a2a with PCP+DCP and NIXL + --kv-offloading-size pass vLLM's parser: only engine start
    (or silently dropped NIXL) would show them. That is why the recipes refuse them."""
    argv = VARIANTS[0].command().argv
    argv[argv.index("--dcp-comm-backend") + 1] = "a2a"
    parse(vllm, argv + ["--kv-offloading-size", "64"])


def test_managed_flag_table_covers_every_vllm_spelling(vllm):
    """Every option string vLLM registers for a flag the recipes manage is recognised
    as managed by our extraArgs check (aliases, negations), and no managed name is a typo."""
    known = set()
    for action in vllm.parser._actions:
        names = [extra_args.parse_flags([s])[0].name for s in action.option_strings]
        known.update(s.lstrip("-") for s in action.option_strings)
        if any(n in extra_args.MANAGED_FLAGS for n in names):
            for s, n in zip(action.option_strings, names):
                assert n in extra_args.MANAGED_FLAGS, f"{s} ({action.dest}) is not recognised as managed"
    missing = [m for m in extra_args.MANAGED_FLAGS if m not in known and m != "model-tag"]
    assert not missing, f"managed flags unknown to vLLM {vllm.version}: {missing}"


def test_serve_picks_one_lb_mode_and_launcher(vllm, variant: Variant, monkeypatch):
    """`vllm serve`'s own launch decision (serve.py: one LB mode, api_server_count, which
    launcher), with the launchers replaced by recorders so nothing starts."""
    import vllm.entrypoints.cli.serve as serve

    launched = []
    monkeypatch.setattr(serve, "run_dp_supervisor", lambda a: launched.append("supervisor"))
    monkeypatch.setattr(serve, "run_headless", lambda a: launched.append("headless"))
    monkeypatch.setattr(serve, "run_multi_api_server", lambda a: launched.append("multi-api"))
    monkeypatch.setattr(serve.uvloop, "run", lambda coro: (coro.close(), launched.append("single")))
    args = vllm.parser.parse_args(variant.command().argv[2:])
    serve.ServeSubcommand.cmd(args)
    lay = role_plan(variant.spec(), variant.role).layout
    assert launched == ["supervisor" if lay.dp_mode == "multi-port" else "single"]
    assert args.api_server_count in (1, None)
