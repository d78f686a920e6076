"""The capacity planner reproduces the seed's GLM-5.3 figures from the architecture alone,
and refuses layouts that cannot hold maxContextTokens, naming what to change."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from longctx_core.api import model_types as api_model, spec as api
from longctx_core.sizing import host_memory, kv_sizing, models, placement, planner
from longctx_core.api.spec import load_spec
from longctx_core.sizing.layout import Layout
from longctx_core.launcher.quantity import GiB
from tests.contract.variants import deep_merge

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"
GLM = models.PRESETS["glm-5.3"]
ONE_M = 1_048_576
K = 1024


def example_spec() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["spec"]


def spec_with(**changes) -> api.LongContextDeploymentSpec:
    """The example spec with nested overrides: spec_with(prefill={"dataParallel": 8})."""
    raw = example_spec()
    deep_merge(raw, changes)
    return load_spec(raw)


DP8_PREFILL = {"contextParallel": {"prefill": 1, "decode": 1}, "dataParallel": 8,
               "cpuOffloadPerRank": "64Gi"}


# ------------------------------------------------------------ the seed's figures


def test_bytes_per_token_is_54728():
    bpt = kv_sizing.kv_bytes_per_token(GLM, "fp8")
    assert (bpt.mla, bpt.indexer, bpt.mtp) == (78 * 656, 21 * 132, 656 + 132)
    assert bpt.total == 54_728


# 53.4 GiB is the seed's one-decimal rounding of 53.445 GiB, so the tolerance is 0.06 GiB.
def test_one_million_token_request_is_53_4_gib():
    bpt = kv_sizing.kv_bytes_per_token(GLM)
    assert kv_sizing.request_kv_bytes(bpt, ONE_M) / GiB == pytest.approx(53.4, abs=0.06)


@pytest.mark.parametrize("pcp, dcp, dp, expected_gib", [
    (8, 8, 1, 6.7),     # PCP8 x DCP8: 53.4 / 8
    (8, 1, 1, 53.4),    # PCP alone replicates the KV on every rank
    (1, 1, 8, 53.4),    # DP8: a whole request on one GPU
])
def test_kv_per_gpu_under_context_parallelism(pcp, dcp, dp, expected_gib):
    bpt = kv_sizing.kv_bytes_per_token(GLM)
    layout = Layout(prefillContextParallel=pcp, decodeContextParallel=dcp,
                                dataParallel=dp)
    assert kv_sizing.kv_bytes_per_gpu(bpt, ONE_M, layout) / GiB == \
        pytest.approx(expected_gib, abs=0.05)


@pytest.mark.parametrize("layout, heads, flops_per_byte", [
    (Layout(tensorParallel=8), 8, 26),                         # TP8
    (Layout(prefillContextParallel=8), 64, 191),               # PCP8
    (Layout(prefillContextParallel=8, decodeContextParallel=8), 64, 191),
    (Layout(tensorParallel=8, decodeContextParallel=8), 64, 191),  # DCP Q gather
])
def test_sparse_mla_flops_per_byte(layout, heads, flops_per_byte):
    assert kv_sizing.heads_per_gpu(GLM, layout) == heads
    assert kv_sizing.sparse_mla_flops_per_byte(GLM, heads) == pytest.approx(flops_per_byte, abs=0.5)


def test_flops_per_byte_matches_footnote_arithmetic():
    # 8 heads: 35.7 MFLOP over 1.37 MB; 64 heads: 285 MFLOP over 1.49 MB.
    assert kv_sizing.flops_per_row_per_head(GLM) == 2176
    assert kv_sizing.query_output_bytes_per_head(GLM) == 2176
    assert 2048 * 8 * 2176 / 1e6 == pytest.approx(35.7, abs=0.05)
    assert (2048 * 660 + 64 * 2176) / 1e6 == pytest.approx(1.49, abs=0.005)


@pytest.mark.parametrize("layout, seed_tokens", [
    (Layout(tensorParallel=8), 32 * K),            # TP8: ~32K
    (Layout(prefillContextParallel=8), 256 * K),   # PCP8: ~256K
])
def test_indexer_crossover(layout, seed_tokens):
    crossover = kv_sizing.indexer_crossover_tokens(GLM, kv_sizing.heads_per_gpu(GLM, layout))
    # Tolerance 3%: the seed quotes round figures ("unos 32K", "unos 256K").
    assert crossover == pytest.approx(seed_tokens, rel=0.03)


def test_indexer_crossover_is_where_flop_counts_meet():
    heads = 8
    crossover = kv_sizing.indexer_crossover_tokens(GLM, heads)

    def indexer(length):  # per GPU under TP8: replicated
        return GLM.indexLayers * length ** 2 / 2 * GLM.indexHeads * GLM.indexHeadDim * 2

    def mla(length):
        return GLM.layers * length * GLM.indexTopK * heads * 2176

    assert indexer(crossover * 0.99) < mla(crossover * 0.99)
    assert indexer(crossover * 1.01) > mla(crossover * 1.01)


def test_no_crossover_without_an_indexer():
    dense = api_model.Architecture(layers=4, attentionHeads=16, kvLoraRank=512, qkRopeHeadDim=64)
    assert kv_sizing.indexer_crossover_tokens(dense, 16) is None


# ------------------------------------------------------------ the example and the baselines


def test_example_prefill_fits_with_the_seed_figures():
    plan = planner.plan(load_spec(example_spec()))
    out = plan.to_json()
    assert out["kvBytesPerToken"] == {"mla": 51168, "indexer": 2772, "mtp": 788, "total": 54728}
    assert out["request"]["kvGiB"] == pytest.approx(53.4, abs=0.06)
    assert out["prefill"]["fits"] is True
    assert out["prefill"]["kvGiBPerGpu"] == pytest.approx(6.7, abs=0.05)
    assert out["prefill"]["sparseMlaFlopsPerByte"] == pytest.approx(191, abs=0.5)
    assert out["prefill"]["indexerCrossoverTokens"] == pytest.approx(256 * K, rel=0.03)
    # The seed: "cada GPU solo tiene espacio para unos 15 GiB".
    assert out["prefill"]["kvBudgetGiBPerGpu"] == pytest.approx(15, abs=1.5)


def test_example_decode_fits_exactly_when_its_host_pool_holds_a_request():
    out = planner.plan(load_spec(example_spec())).to_json()
    hs = out["decode"]["hiSparse"]
    assert out["decode"]["fits"] is (hs["hostPoolGiBPerRank"] >= hs["hostPoolMinGiBPerRank"])
    assert out["fits"] is out["decode"]["fits"]


@pytest.mark.parametrize("pool, fits, per_rank", [
    ("48Gi", False, 0),    # 79 layers x 656 B x 1M tokens = 50.6 GiB > 48 GiB
    ("51Gi", True, 1),
    ("104Gi", True, 2),
])
def test_hisparse_decode_host_pool(pool, fits, per_rank):
    plan = planner.plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": pool}}))
    out = plan.to_json()
    assert out["decode"]["hiSparse"]["hostPoolRequestsPerRank"] == per_rank
    assert out["decode"]["fits"] is fits
    # Concurrency = per-rank requests x ranks x pods.
    assert out["decode"]["maxConcurrentAtMaxContext"] == per_rank * 8
    if not fits:
        assert "spec.decode.hiSparse.hostPoolPerRank" in plan.refusal
        assert "at least 51Gi" in plan.refusal
    else:
        assert plan.fits and plan.refusal is None


def test_hisparse_min_pool_is_vllms_page_rule():
    need = planner.hisparse_min_pool_bytes(GLM, ONE_M)
    assert need == (ONE_M // 64 + 2) * 79 * 64 * 656
    assert 50 * GiB < need < 51 * GiB


def test_decode_concurrency_scales_with_replicas():
    one = planner.plan(spec_with(decode={"hiSparse": {"hostPoolPerRank": "51Gi"}}))
    two = planner.plan(spec_with(decode={"replicas": 2, "hiSparse": {"hostPoolPerRank": "51Gi"}}))
    assert two.decode.max_concurrent == 2 * one.decode.max_concurrent == 16


def test_dp8_prefill_baseline_does_not_fit_and_says_what_to_change():
    plan = planner.plan(spec_with(prefill=DP8_PREFILL))
    assert not plan.prefill.fits and not plan.fits
    out = plan.to_json()
    assert out["prefill"]["kvGiBPerGpu"] == pytest.approx(53.4, abs=0.06)
    refusal = plan.refusal
    assert "spec.prefill.contextParallel.decode" in refusal
    assert "spec.prefill.contextParallel.prefill" in refusal
    # The suggested DCP is the smallest power of two whose shard fits the budget.
    budget = plan.prefill.budget.kv
    smallest = next(n for n in (1, 2, 4, 8)
                    if math.ceil(ONE_M / n) * 54728 <= budget)
    assert f"to {smallest} (the smallest" in refusal
    assert "spec.maxContextTokens" in refusal
    # Offload capacity: 64 GiB per rank of whole 54,728-byte tokens, 8 ranks.
    assert out["prefill"]["cpuOffloadTokensPerRank"] == 64 * GiB // 54728
    assert out["prefill"]["cpuOffloadTokens"] == 8 * (64 * GiB // 54728)


def test_offload_only_decode_does_not_fit_one_million_tokens():
    # The seed's offload-only baseline: 16 GiB of CPU offload per rank, no HiSparse.
    plan = planner.plan(spec_with(decode={"hiSparse": {"enabled": False},
                                          "cpuOffloadPerRank": "16Gi"}))
    assert not plan.decode.fits and not plan.fits
    out = plan.to_json()
    assert out["decode"]["maxConcurrentAtMaxContext"] == 0
    assert out["decode"]["kvGiBPerGpu"] == pytest.approx(53.4, abs=0.06)
    assert "spec.decode.hiSparse.enabled" in plan.refusal
    assert "spec.decode.contextParallel.decode" in plan.refusal
    # The offload tier holds whole tokens when HiSparse is off.
    assert out["decode"]["cpuOffloadTokensPerRank"] == 16 * GiB // 54728


def test_offload_only_decode_fits_a_short_context():
    plan = planner.plan(spec_with(maxContextTokens=131072, decode={"hiSparse": {"enabled": False}}))
    assert plan.decode.fits
    assert plan.decode.max_concurrent == plan.decode.budget.kv // (131072 * 54728) * 8


# ------------------------------------------------------------ inputs


@pytest.mark.parametrize("budget, prefill_fits", [("6Gi", False), ("7Gi", True), ("80Gi", True)])
def test_kv_budget_override(budget, prefill_fits):
    plan = planner.plan(spec_with(capacity={"kvBudgetPerGpu": budget}))
    out = plan.to_json()
    assert out["prefill"]["kvBudgetSource"] == "spec.capacity.kvBudgetPerGpu"
    assert out["prefill"]["kvBudgetGiBPerGpu"] == float(budget[:-2])
    assert out["prefill"]["fits"] is prefill_fits
    if not prefill_fits:
        assert "spec.capacity.kvBudgetPerGpu is 6.0 GiB" in plan.refusal


def test_override_makes_dp8_prefill_fit():
    plan = planner.plan(spec_with(prefill=DP8_PREFILL, capacity={"kvBudgetPerGpu": "60Gi"}))
    assert plan.prefill.fits
    assert plan.prefill.max_concurrent == 8


def test_explicit_architecture_matches_the_preset():
    arch = {f: getattr(GLM, f) for f in ("layers", "mtpLayers", "attentionHeads", "kvLoraRank",
                                          "qkRopeHeadDim", "indexLayers", "indexHeads",
                                          "indexHeadDim", "indexTopK", "parameterBytes",
                                          "replicatedParameterBytes")}
    raw = example_spec()
    raw["model"].pop("preset")
    raw["model"]["architecture"] = arch
    explicit = planner.plan(load_spec(raw)).to_json()
    preset = planner.plan(load_spec(example_spec())).to_json()
    assert explicit["model"]["preset"] is None
    explicit["model"]["preset"] = preset["model"]["preset"]
    assert explicit == preset


def test_explicit_architecture_without_weights_needs_a_budget():
    raw = example_spec()
    raw["model"].pop("preset")
    raw["model"]["architecture"] = {"layers": 61, "mtpLayers": 1, "attentionHeads": 128,
                                    "kvLoraRank": 512, "qkRopeHeadDim": 64, "indexLayers": 61,
                                    "indexHeads": 64, "indexHeadDim": 128, "indexTopK": 2048}
    plan = planner.plan(load_spec(raw))
    assert not plan.fits and "spec.capacity.kvBudgetPerGpu" in plan.refusal
    raw["capacity"] = {"kvBudgetPerGpu": "20Gi"}
    raw["decode"]["hiSparse"]["hostPoolPerRank"] = "64Gi"
    plan = planner.plan(load_spec(raw))
    # DSV3.2: 61 x 656 + 61 x 132 + 1 x 788 = 48,856 B/token.
    assert plan.bytes_per_token.total == 61 * 656 + 61 * 132 + 788
    assert plan.prefill.fits


def test_replicated_bytes_unset_divides_everything_by_the_ep_group():
    arch = GLM
    layout = Layout(prefillContextParallel=8)
    without = api_model.Architecture(**{**arch.__dict__, "replicatedParameterBytes": None})
    total = int(arch.parameterBytes)
    assert kv_sizing.weights_bytes_per_gpu(without, layout) == -(-total // 8)
    assert kv_sizing.weights_bytes_per_gpu(arch, layout) > total / 8


def test_deepseek_preset_plans():
    raw = example_spec()
    raw["model"]["preset"] = "deepseek-v3.2"
    raw["maxContextTokens"] = 163840
    out = planner.plan(load_spec(raw)).to_json()
    assert out["kvBytesPerToken"]["total"] == 48856
    assert out["prefill"]["fits"] and out["decode"]["fits"]
    # 128 heads per GPU under PCP: 2048 x 2176 x 128 / (2048 x 660 + 128 x 2176).
    assert out["prefill"]["sparseMlaFlopsPerByte"] == pytest.approx(
        2048 * 2176 * 128 / (2048 * 660 + 128 * 2176), abs=0.05)


# ------------------------------------------------------------ JSON contract


REQUIRED_KEYS = ["kvBytesPerToken.mla", "kvBytesPerToken.indexer", "kvBytesPerToken.mtp",
                 "kvBytesPerToken.total", "request.kvGiB", "prefill.kvGiBPerGpu", "prefill.fits",
                 "prefill.sparseMlaFlopsPerByte", "prefill.indexerCrossoverTokens",
                 "decode.maxConcurrentAtMaxContext", "decode.fits",
                 "prefill.kvBudgetGiBPerGpu", "decode.kvBudgetGiBPerGpu",
                 "decode.hiSparse.hostPoolGiBPerRank", "prefill.cpuOffloadTokens",
                 "decode.cpuOffloadTokens", "fits", "refusal"]


@pytest.mark.parametrize("changes", [
    {},
    {"prefill": DP8_PREFILL},
    {"decode": {"hiSparse": {"enabled": False}}},
    {"capacity": {"kvBudgetPerGpu": "20Gi"}},
])
def test_to_json_has_the_keys_and_is_strict_json(changes):
    out = planner.plan(spec_with(**changes)).to_json()
    for dotted in REQUIRED_KEYS:
        node = out
        for part in dotted.split("."):
            if dotted.startswith("decode.hiSparse") and changes.get("decode"):
                break
            assert part in node, dotted
            node = node[part]
    text = json.dumps(out, allow_nan=False, sort_keys=True)
    assert json.loads(text) == out
    # Stable: the same spec gives the same plan.
    assert json.dumps(planner.plan(spec_with(**changes)).to_json(), sort_keys=True) == text


def test_capacity_plan_is_frozen():
    plan = planner.plan(load_spec(example_spec()))
    with pytest.raises(AttributeError):
        plan.refusal = "x"  # type: ignore[misc]


# ------------------------------------------------------------ host memory of the nodes


def _node(name: str, memory: str, gpu_mib: str | None = None, **labels: str) -> host_memory.NodeMemory:
    meta_labels = {placement.GPU_PRODUCT_LABEL: "NVIDIA-H200", **labels}
    if gpu_mib:
        meta_labels[host_memory.GPU_MEMORY_LABEL] = gpu_mib
    return host_memory.NodeMemory.from_manifest({"metadata": {"name": name, "labels": meta_labels},
                                             "status": {"allocatable": {"memory": memory}}})


def test_offline_the_host_memory_is_not_checked_and_the_plan_says_so():
    plan = planner.plan(spec_with())
    assert plan.fits and plan.host_memory["checked"] is False
    assert any("host memory per pod was not checked" in n for n in plan.notes)


def test_the_example_fits_the_largest_selected_node():
    plan = planner.plan(spec_with(), [_node("small", "64Gi"), _node("big", "2Ti")])
    assert plan.fits, plan.refusal
    assert plan.host_memory["largestAllocatableGiB"] == 2048
    assert plan.host_memory["prefillPodGiB"] < 2048 and plan.host_memory["decodePodGiB"] < 2048


@pytest.mark.parametrize("change, field", [
    ({"prefill": {"cpuOffloadPerRank": "1Ei"}}, "spec.prefill.cpuOffloadPerRank (1Ei)"),
    ({"decode": {"hiSparse": {"hostPoolPerRank": "1Pi"}}},
     "spec.decode.hiSparse.hostPoolPerRank (1Pi)"),
    ({"decode": {"cpuOffloadPerRank": "300Gi"}}, "spec.decode.cpuOffloadPerRank (300Gi)"),
])
def test_a_pod_larger_than_every_selected_node_is_refused_naming_the_field(change, field):
    plan = planner.plan(spec_with(**change), [_node("h200-0", "1Ti"), _node("h200-1", "2Ti")])
    assert not plan.fits and plan.reason == "InsufficientHostMemory"
    assert field in plan.refusal
    assert "(h200-1, nvidia.com/gpu.product=NVIDIA-H200) has 2048.0 GiB allocatable" in \
        plan.refusal, plan.refusal


def test_only_the_nodes_the_placement_selects_count():
    nodes = [_node("other", "64Ti", **{placement.GPU_PRODUCT_LABEL: "NVIDIA-B200"}),
             _node("h200", "256Gi")]
    plan = planner.plan(spec_with(), nodes)
    assert not plan.fits and "(h200," in plan.refusal
    pool = spec_with(placement={"nodeSelector": {"pool": "long"}})
    skipped = planner.plan(pool, nodes)
    assert skipped.fits and skipped.host_memory["checked"] is False
    assert any("no node matches the placement" in n for n in skipped.notes)


def test_gpu_figures_are_bounded_by_the_gpu():
    labelled = [_node("h200", "2Ti", gpu_mib="143771")]
    plan = planner.plan(spec_with(capacity={"gpuMemory": "1Ei"}), labelled)
    assert not plan.fits and "spec.capacity.gpuMemory (1Ei" in plan.refusal
    for capacity, field in (({"kvBudgetPerGpu": "1Ti"}, "spec.capacity.kvBudgetPerGpu (1Ti)"),
                            ({"activationReservePerGpu": "1Ti"},
                             "spec.capacity.activationReservePerGpu (1Ti)")):
        offline = planner.plan(spec_with(capacity=capacity))
        assert not offline.fits and field in offline.refusal, offline.refusal


# ------------------------------------------------------------ every refusal offers a value that fits


def _offered(pattern: str, refusal: str) -> str:
    found = re.findall(pattern, refusal)
    assert found, refusal
    return found[0]


def test_an_unknown_kv_budget_is_refused_with_the_budget_one_request_needs():
    arch = {k: v for k, v in api.dump(GLM).items() if k not in ("parameterBytes",
                                                                 "replicatedParameterBytes")}
    spec = spec_with(model={"preset": None, "architecture": arch})
    plan = planner.plan(spec)
    assert not plan.fits
    # Both roles are refused, each with what it needs: the larger fits both.
    offered = re.findall(r"kvBudgetPerGpu to at least (\d+)Gi", plan.refusal)
    budget = f"{max(int(v) for v in offered)}Gi"
    assert planner.plan(spec_with(model={"preset": None, "architecture": arch},
                                  capacity={"kvBudgetPerGpu": budget})).fits


def test_a_hisparse_request_too_large_for_the_gpu_is_refused_with_a_context_that_fits():
    spec = spec_with(capacity={"kvBudgetPerGpu": "2Gi"})
    plan = planner.plan(spec)
    assert not plan.fits and "HiSparse request keeps" in plan.refusal
    tokens = int(_offered(r"HiSparse request keeps .*?maxContextTokens to at most (\d+)",
                          plan.refusal))
    assert planner.plan(spec_with(capacity={"kvBudgetPerGpu": "2Gi"},
                                  maxContextTokens=tokens)).decode.fits
    assert not planner.plan(spec_with(capacity={"kvBudgetPerGpu": "2Gi"},
                                      maxContextTokens=tokens + 64)).decode.fits


@pytest.mark.parametrize("change", [{"decode": {"cpuOffloadPerRank": "300Gi"}},
                                    {"decode": {"hiSparse": {"hostPoolPerRank": "200Gi"}}}])
def test_a_pod_too_large_for_the_nodes_is_refused_with_a_value_that_fits(change):
    nodes = [_node("h200", "1Ti")]
    plan = planner.plan(spec_with(**change), nodes)
    assert not plan.fits
    value = _offered(r"lower it to at most (\d+Gi)", plan.refusal)
    ((role, fields),) = change.items()
    ((name, old),) = fields.items()
    fixed = {role: {name: {"hostPoolPerRank": value} if isinstance(old, dict) else value}}
    assert planner.plan(spec_with(**fixed), nodes).fits


def test_an_auto_pool_too_large_for_the_nodes_is_refused_with_the_requests_that_fit():
    nodes = [_node("h200", "1Ti")]
    spec = spec_with(decode={"hiSparse": {"hostPoolPerRank": "auto", "requestsPerRank": 3}})
    plan = planner.plan(spec, nodes)
    assert not plan.fits and "hostPoolPerRank (auto = " in plan.refusal
    requests = int(_offered(r"requestsPerRank \(3\) to at most (\d+)", plan.refusal))
    assert planner.plan(spec_with(decode={"hiSparse": {"requestsPerRank": requests}}),
                        nodes).fits


def test_a_node_without_a_memory_quantity_is_ignored():
    assert host_memory.NodeMemory.from_manifest({"metadata": {"name": "x"}, "status": {}}) is None
