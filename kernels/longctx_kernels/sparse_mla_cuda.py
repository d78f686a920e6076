"""Sparse MLA decode on the hand-written CUDA kernels for sm_90 (csrc/sparse_mla_decode.cu for
up to 16 heads, csrc/sparse_mla_wgmma.cu for more), how many slices of the top-k list each
launches, and the dispatch to the fastest kernel for the head count and GPU. The contract is
that of :func:`.sparse_mla.sparse_mla_decode`."""

from __future__ import annotations

import ctypes
import math

import torch
import triton

from .sparse_mla import LATENT, ROPE, ROW_BYTES, slice_outputs, sparse_mla_decode


def sparse_mla_decode_cuda(
    q: torch.Tensor,
    cache: torch.Tensor,
    topk_slots: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
    tile: int | None = None,
    stages: int | None = None,
    teams: int | None = None,
    producers: int | None = None,
    ctas_per_sm: int = 1,
    programmatic: bool = True,
    wgmma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hand-written CUDA kernel (csrc/sparse_mla_decode.cu) for up to 16 heads on sm_90 (its
    e4m3 -> fp16 conversion is an Ada/Hopper instruction, its merge a Hopper cluster): same
    contract as :func:`sparse_mla_decode`. A request's top-k list is cut into `num_splits` (1, 2 or
    4; by default the count whose clusters finish first, see :func:`_cuda_splits`) slices, one CTA
    each; the CTAs of a request are one thread-block cluster and merge their outputs through
    distributed shared memory, so there is no second kernel. A CTA holds `teams` teams of 4
    consumer warps, which take the slice's tiles in turn, and `producers` warps that stream `tile`
    (32 or 64) rows a step into a ring of `stages`; `ctas_per_sm` is the register budget's target
    (__launch_bounds__). `wgmma` (the default above 8 heads, sm_90a): each team is a warpgroup
    on warpgroup MMAs with tokens, then latent dims, as M and the 16 heads as N, 64-row tiles,
    four producer warps moving each row by one bulk copy and giving their registers to the
    consumers (setmaxnreg); otherwise one warp
    a latent group on mma.sync. The defaults were the best at B=64, K=2048 on an H200
    (docs/benchmarks.md): 64-row tiles in 3 stages, on mma.sync for up to 8 heads and wgmma for 9
    to 16 (mma.sync there: 32-row tiles in 5 stages, 25% slower)."""
    from .cuda_module import load

    batch, heads, dim = q.shape
    assert dim == LATENT + ROPE and heads <= 16 and cache.dtype == torch.uint8 and cache.shape[-1] == ROW_BYTES
    assert q.dtype == torch.bfloat16 and topk_slots.dtype == torch.int32
    assert cache.numel() // 16 < 2**32, "the kernel addresses the cache in 16-B units, 32 bits"
    wgmma = heads > 8 if wgmma is None else wgmma
    if wgmma and not (heads > 8 and tile in (None, 64) and torch.cuda.get_device_capability(q.device) == (9, 0)):
        raise ValueError(f"sparse_mla_decode_cuda: wgmma takes 9 to 16 heads (got {heads}) in 64-row tiles (got "
                         f"tile={tile}) on an sm_90 GPU; pass wgmma=False for the mma.sync kernel")
    tile = tile or (64 if heads <= 8 or wgmma else 32)
    teams = teams or 2
    producers = producers or (4 if wgmma else 2)
    stages = stages or (3 if tile == 64 else 5)
    assert num_splits in (None, 1, 2, 4) and tile in (32, 64) and stages >= 2 and 32 % producers == 0
    threads = 32 * (4 * teams + producers)

    def kernel_for(splits: int):
        defines = (("SPARSE_MLA_TILE", tile), ("SPARSE_MLA_STAGES", stages),
                   ("SPARSE_MLA_HEAD_TILES", 1 if heads <= 8 else 2), ("SPARSE_MLA_CTAS_PER_SM", ctas_per_sm),
                   ("SPARSE_MLA_PRODUCERS", producers), ("SPARSE_MLA_SPLITS", splits), ("SPARSE_MLA_TEAMS", teams),
                   ("SPARSE_MLA_WGMMA", int(wgmma)))
        return load("sparse_mla_decode.cu", "sparse_mla_decode", q.device.index, defines, "a" if wgmma else "")

    num_splits = num_splits or _cuda_splits(batch, lambda s: kernel_for(s).clusters_at_once(s, threads))
    kernel = kernel_for(num_splits)
    q = q.contiguous()
    topk_slots = topk_slots.contiguous()
    k = topk_slots.shape[1]
    k_per_split = triton.cdiv(triton.cdiv(k, num_splits), 64) * 64  # trailing slices may be empty
    out, out_lse = slice_outputs(q, 1, torch.bfloat16, out, out_lse)
    ptr, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    kernel.launch((num_splits, batch, 1), threads, [
        (q.data_ptr(), ptr), (cache.data_ptr(), ptr), (topk_slots.data_ptr(), ptr), (out.data_ptr(), ptr),
        (out_lse.data_ptr(), ptr), (batch, i32), (heads, i32), (k, i32), (k_per_split, i32),
        (sm_scale / math.log(2.0), f32)], torch.cuda.current_stream(q.device).cuda_stream, programmatic)
    return out, out_lse


WGMMA_HEADS = 64  # heads a CTA of the wgmma kernel
WGMMA_TILE = 64  # tokens a tile of the wgmma kernel
WGMMA_THREADS = 384  # its two consumer warpgroups and the producer
WGMMA_MIN_SLICE = 128  # tokens a slice at least: the prologue (q into shared memory) is not worth fewer


def sparse_mla_decode_wgmma(
    q: torch.Tensor,
    cache: torch.Tensor,
    topk_slots: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hand-written wgmma kernel (csrc/sparse_mla_wgmma.cu) for many heads on sm_90a: same
    contract as :func:`sparse_mla_decode`. A CTA takes 64 heads (fewer are zero rows, more take
    several CTAs) of one request and one of `num_splits` slices of its top-k list (1, 2, 4 or 8;
    by default enough that the CTAs fill the GPU once, see :func:`_wgmma_splits`); a request's
    slices are one thread-block cluster and merge their outputs in the kernel."""
    from .cuda_module import load

    batch, heads, dim = q.shape
    assert dim == LATENT + ROPE and cache.dtype == torch.uint8 and cache.shape[-1] == ROW_BYTES
    assert q.dtype == torch.bfloat16 and topk_slots.dtype == torch.int32
    assert torch.cuda.get_device_capability(q.device) == (9, 0), "wgmma needs an sm_90 GPU (H100, H200)"
    assert cache.numel() // ROW_BYTES < 2**31, "the kernel addresses rows with 32-bit slots"
    head_blocks = triton.cdiv(heads, WGMMA_HEADS)
    k = topk_slots.shape[1]
    if num_splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        num_splits = _wgmma_splits(batch * head_blocks, k, sms)
    if num_splits not in (1, 2, 4, 8):
        raise ValueError(f"sparse_mla_decode_wgmma: num_splits={num_splits}; the slices of a request are one "
                         "cluster merging whole 64-column blocks: pass 1, 2, 4 or 8")
    k_per_split = triton.cdiv(triton.cdiv(k, num_splits), WGMMA_TILE) * WGMMA_TILE  # trailing slices may be empty
    q = q.contiguous()
    topk_slots = topk_slots.contiguous()
    out, out_lse = slice_outputs(q, 1, torch.bfloat16, out, out_lse)
    kernel = load("sparse_mla_wgmma.cu", "sparse_mla_wgmma", q.device.index, (("SPARSE_MLA_SPLITS", num_splits),),
                  arch_suffix="a")
    ptr, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    kernel.launch((num_splits, batch, head_blocks), WGMMA_THREADS, [
        (q.data_ptr(), ptr), (cache.data_ptr(), ptr), (topk_slots.data_ptr(), ptr), (out.data_ptr(), ptr),
        (out_lse.data_ptr(), ptr), (batch, i32), (heads, i32), (k, i32), (k_per_split, i32),
        (sm_scale / math.log(2.0), f32)], torch.cuda.current_stream(q.device).cuda_stream, programmatic=True)
    return out, out_lse


def _wgmma_splits(ctas: int, k: int, sms: int) -> int:
    """Slices of the top-k list for the wgmma kernel (one CTA an SM): the largest power of two
    that fills the SMs once (B=64 on 132 SMs: 2), at most 8 (a portable cluster), and at least
    WGMMA_MIN_SLICE tokens a slice."""
    fit = max(1, min(8, sms // max(ctas, 1), k // WGMMA_MIN_SLICE))
    return 1 << (fit.bit_length() - 1)


def sparse_mla_decode_auto(
    q: torch.Tensor, cache: torch.Tensor, topk_slots: torch.Tensor, sm_scale: float,
    out: torch.Tensor | None = None, out_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode by the fastest kernel for the head count and GPU: on sm_90, the CUDA
    kernel for up to 16 heads (mma.sync up to 8, warpgroup MMAs for 9 to 16) and the wgmma kernel
    above that; elsewhere the Triton kernel."""
    heads = q.shape[1]
    if q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0):
        if heads <= 16:
            return sparse_mla_decode_cuda(q, cache, topk_slots, sm_scale, out=out, out_lse=out_lse)
        return sparse_mla_decode_wgmma(q, cache, topk_slots, sm_scale, out=out, out_lse=out_lse)
    return sparse_mla_decode(q, cache, topk_slots, sm_scale, out=out, out_lse=out_lse)


def _cuda_splits(batch: int, clusters_at_once) -> int:
    """Slices a request for the CUDA kernel: the count (4, 2, 1) whose clusters take the fewest
    slice-lengths of time, waves of clusters x (1 / slices), ties to fewer waves. On an H200 at
    1 CTA/SM, 30 clusters of 4 fit at once, 66 of 2 and 132 of 1: B <= 30 takes 4 slices, 31-66
    two, 96-132 one (docs/benchmarks.md: B=1 13.9 us with 4 slices against 23.2 with 2)."""
    def cost(splits: int) -> tuple[float, int]:
        waves = -(-batch // clusters_at_once(splits))
        return waves / splits, waves
    return min((4, 2, 1), key=cost)
