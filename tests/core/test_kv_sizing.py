"""KV sizing reproduces the seed's GLM-5.3 figures from the architecture alone: bytes per
token, KV per GPU under context parallelism, sparse MLA's FLOPs per byte, the indexer
crossover and the weights per GPU."""

from __future__ import annotations

import pytest

from longctx_core.api import model_types as api_model
from longctx_core.quantity import GiB
from longctx_core.sizing import kv_sizing
from longctx_core.sizing.layout import Layout
from tests.core.planner_support import GLM, K, ONE_M


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


def test_replicated_bytes_unset_divides_everything_by_the_ep_group():
    arch = GLM
    layout = Layout(prefillContextParallel=8)
    without = api_model.Architecture(**{**arch.__dict__, "replicatedParameterBytes": None})
    total = int(arch.parameterBytes)
    assert kv_sizing.weights_bytes_per_gpu(without, layout) == -(-total // 8)
    assert kv_sizing.weights_bytes_per_gpu(arch, layout) > total / 8
