import pytest
import torch

from longctx_kernels.sparse_mla import (
    pack_fp8_ds_mla_rows,
    sparse_mla_decode,
    sparse_mla_decode_reference,
    unpack_fp8_ds_mla_rows,
)
from longctx_kernels.sparse_mla_cuda import _cuda_splits, _wgmma_splits, sparse_mla_decode_auto

from .conftest import relative_error


def test_row_layout_is_656_bytes_and_round_trips(gen):
    kv = torch.randn(10, 576, generator=gen)
    rows = pack_fp8_ds_mla_rows(kv)
    assert rows.shape == (10, 656) and rows.dtype == torch.uint8
    assert torch.equal(rows[:, 528:].contiguous().view(torch.bfloat16), kv[:, 512:].bfloat16())
    # e4m3 keeps 3 mantissa bits: per-group scaling bounds the error near 2^-4.
    assert relative_error(unpack_fp8_ds_mla_rows(rows), kv) < 0.05


@pytest.mark.parametrize(
    "heads,topk,num_splits,partial_dtype,block_k,ncol,prefetch",
    [
        (8, 128, 1, torch.float32, 64, 1, False),
        (16, 192, 3, torch.float32, 64, 1, False),
        (8, 192, 4, torch.bfloat16, 64, 1, False),
        (64, 64, 1, torch.float32, 64, 1, False),
        (8, 160, 2, torch.bfloat16, 32, 1, True),  # prefetch; the last tile of each split is partial
        (8, 96, 3, torch.float32, 16, 2, True),
        (24, 96, 2, torch.float32, 32, 4, False),  # two head blocks, 4 column slices
    ],
)
def test_sparse_mla_decode_matches_reference(heads, topk, num_splits, partial_dtype, block_k, ncol, prefetch, gen):
    batch, num_blocks = 3, 12
    cache = pack_fp8_ds_mla_rows(torch.randn(num_blocks * 64, 576, generator=gen)).reshape(num_blocks, 64, 656)
    q = torch.randn(batch, heads, 576, generator=gen).bfloat16()
    slots = torch.randint(0, num_blocks * 64, (batch, topk), generator=gen, dtype=torch.int32)
    slots[0, : topk // 3] = -1  # padding entries
    slots[2] = -1  # a request with nothing selected (e.g. a DCP rank owning none of its tokens)
    out = torch.full((batch, heads, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((batch, heads), float("nan"))
    sparse_mla_decode(q, cache, slots, 576**-0.5, num_splits=num_splits, block_h=16,
                      block_k=block_k, partial_dtype=partial_dtype, out=out, out_lse=lse,
                      num_col_splits=ncol, prefetch=prefetch)
    ref, ref_lse = sparse_mla_decode_reference(q, cache, slots, 576**-0.5)
    assert relative_error(out, ref) < 1e-2
    assert torch.equal(out[2], torch.zeros_like(out[2])) and (lse[2] == float("-inf")).all()
    assert relative_error(lse[:2], ref_lse[:2]) < 1e-5


# Clusters that fit at once on an H200 at 1 CTA/SM (cuOccupancyMaxActiveClusters): 4 slices, 2, 1.
H200_CLUSTERS = {4: 30, 2: 66, 1: 132}


@pytest.mark.parametrize("batch,splits", [(1, 4), (30, 4), (31, 2), (64, 2), (66, 2), (96, 1), (132, 1)])
def test_cuda_kernel_takes_the_slice_count_whose_clusters_finish_first(batch, splits):
    # 31 requests in clusters of 4 would need a second wave; 96 in clusters of 2 too, and one wave of
    # whole lists ties with two waves of halves: the fewer waves win.
    assert _cuda_splits(batch, H200_CLUSTERS.get) == splits


def test_cuda_slice_count_follows_what_the_gpu_holds():
    # A GPU that holds only 8 clusters of 4 sends 16 requests to clusters of 2.
    assert _cuda_splits(16, {4: 8, 2: 66, 1: 132}.get) == 2


@pytest.mark.parametrize("ctas,k,splits", [(64, 2048, 2), (1, 2048, 8), (132, 2048, 1), (128, 2048, 1), (2, 300, 2),
                                          (1, 100, 1), (40, 2048, 2), (20, 2048, 4)])
def test_wgmma_kernel_slices_fill_the_gpu_once(ctas, k, splits):
    # 132 SMs, one CTA each: B=64 takes 2 slices; a lone request at most 8; every slice >= 128
    # tokens; a power of two (a CTA of the cluster merges 512 / slices columns): 40 requests 2, not 3.
    assert _wgmma_splits(ctas, k, 132) == splits


def test_dispatch_off_an_h200_runs_the_triton_kernel(gen):
    # On the CPU (the interpreter) the dispatcher falls back to Triton for any head count.
    cache = pack_fp8_ds_mla_rows(torch.randn(256, 576, generator=gen)).reshape(4, 64, 656)
    q = torch.randn(2, 20, 576, generator=gen).bfloat16()
    slots = torch.randint(0, 256, (2, 48), generator=gen, dtype=torch.int32)
    slots[1] = -1
    out, lse = sparse_mla_decode_auto(q, cache, slots, 576**-0.5)
    ref, ref_lse = sparse_mla_decode_reference(q, cache, slots, 576**-0.5)
    assert relative_error(out, ref) < 1e-2 and relative_error(lse[0], ref_lse[0]) < 1e-5
    assert (lse[1] == float("-inf")).all() and torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("stages,teams,producers", [(3, 2, 4), (3, 1, 2), (4, 1, 2)])
@pytest.mark.parametrize("splits", [1, 2, 4])
def test_few_head_wgmma_kernel_compiles_for_sm90a_without_spills_or_serialized_mma(stages, teams, producers, splits):
    # The layouts benchmarks/cuda_kernel_checks.py runs on an H200; compiled here without a GPU.
    from longctx_kernels.cuda_module import CSRC, compile_cubin

    from .test_cuda_module import cuobjdump, resource_usage

    defines = (("SPARSE_MLA_TILE", 64), ("SPARSE_MLA_STAGES", stages), ("SPARSE_MLA_HEAD_TILES", 2),
               ("SPARSE_MLA_PRODUCERS", producers), ("SPARSE_MLA_SPLITS", splits), ("SPARSE_MLA_TEAMS", teams),
               ("SPARSE_MLA_WGMMA", 1))
    cubin = compile_cubin((CSRC / "sparse_mla_decode.cu").read_text(), "sm_90a", defines)
    usage = resource_usage(cubin)
    assert usage["STACK"] == 0 and usage["LOCAL"] == 0
    sass = cuobjdump(cubin, "--dump-sass")
    # A tile: S as 4 latent groups x 8 k-steps (fp16) and 4 rope steps (bf16), P.V as 4 groups x 2
    # slabs x 4 token chunks, all m64n16k16.
    assert sass.count("HGMMA.64x16x16.F32 ") + sass.count("HGMMA.64x16x16.F32.BF16") == 68
    assert sass.count("HGMMA.64x16x16.F32.BF16") == 4
    # ptxas serializes wgmmas it cannot keep in flight by a wait after each one; the tile waits 7 times.
    assert sass.count("WARPGROUP.DEPBAR") == 7


def test_wgmma_cuts_still_match_the_kernel_and_compile():
    """benchmarks/sparse_mla_cuts.py --heads 16 cuts parts out of the kernel's source by text."""
    import importlib.util
    from pathlib import Path

    from longctx_kernels.cuda_module import CSRC, compile_cubin

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "sparse_mla_cuts.py"
    spec = importlib.util.spec_from_file_location("sparse_mla_cuts", path)
    cuts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cuts)
    source = (CSRC / cuts.SOURCE).read_text()
    defines = (("SPARSE_MLA_TILE", 64), ("SPARSE_MLA_STAGES", 3), ("SPARSE_MLA_HEAD_TILES", 2),
               ("SPARSE_MLA_PRODUCERS", 4), ("SPARSE_MLA_WGMMA", 1))
    for name, edits in cuts.WGMMA_CUTS.items():
        text = source
        for old, new in edits:
            assert old in text, f"cut {name!r}: {old!r} is no longer in {cuts.SOURCE}"
            text = text.replace(old, new)
        compile_cubin(text, "sm_90a", defines)
