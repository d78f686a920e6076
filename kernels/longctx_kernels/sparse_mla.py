"""Sparse MLA decode over the top-k rows of an fp8 paged KV cache.

Row layout (``fp8_ds_mla``, 656 B per token): 512 fp8 e4m3 latent values,
4 fp32 scales (one per group of 128 latent values), 64 bf16 rope values. The
cache is ``uint8 [num_blocks, block_size, 656]``; top-k ids are physical slots
``block * block_size + offset`` (-1 = no token). The query is absorbed:
``q [B, H, 576]`` bf16 (512 latent + 64 rope); V is the dequantized latent.

The kernel never multiplies the dequantized tile: a group's scale s is folded
into the scores (``q . (s k8) = s (q . k8)``) and into P for the P @ V product,
so the only per-element work on K/V is the exact fp8 -> bf16 conversion.
Outputs: ``out [B, H, 512]`` bf16 and ``lse [B, H]`` fp32 in base e (-inf
where no valid token was selected, with out = 0: the merge's identity).

The hand-written CUDA kernels of the same contract are in sparse_mla_cuda.py.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._runtime import bf16_dot_dtype, interpreting
from .lse_merge import lse_merge

ROW_BYTES = 656
LATENT = 512
ROPE = 64
GROUP = 128
_SCALES_OFFSET = LATENT  # byte offset of the 4 fp32 scales
_ROPE_OFFSET = LATENT + 4 * 4  # byte offset of the 64 bf16 rope values
FP8_MAX = 448.0


def pack_fp8_ds_mla_rows(kv: torch.Tensor) -> torch.Tensor:
    """[n, 576] float -> [n, 656] uint8 rows (per-128-group amax scaling)."""
    latent = kv[:, :LATENT].float().reshape(-1, LATENT // GROUP, GROUP)
    scales = (latent.abs().amax(dim=-1) / FP8_MAX).clamp(min=1e-10)
    fp8 = (latent / scales.unsqueeze(-1)).to(torch.float8_e4m3fn).reshape(-1, LATENT)
    return torch.cat(
        [
            fp8.view(torch.uint8),
            scales.float().contiguous().view(torch.uint8),
            kv[:, LATENT:].to(torch.bfloat16).contiguous().view(torch.uint8),
        ],
        dim=1,
    )


def random_fp8_ds_mla_cache(num_rows: int, generator: torch.Generator, page: int = 64) -> torch.Tensor:
    """A benchmark's cache on the GPU: [num_rows / page, page, 656] uint8 rows of N(0, 1) values,
    packed 2^20 rows at a time to bound the fp32 temporaries."""
    cache = torch.empty(num_rows, ROW_BYTES, dtype=torch.uint8, device="cuda")
    for s in range(0, num_rows, 1 << 20):
        cache[s : s + (1 << 20)] = pack_fp8_ds_mla_rows(
            torch.randn(min(1 << 20, num_rows - s), LATENT + ROPE, device="cuda", generator=generator))
    return cache.reshape(num_rows // page, page, ROW_BYTES)


def unpack_fp8_ds_mla_rows(rows: torch.Tensor) -> torch.Tensor:
    """[n, 656] uint8 -> [n, 576] fp32 (the dequantized latent and rope)."""
    latent = rows[:, :LATENT].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, LATENT // GROUP, GROUP)
    scales = rows[:, _SCALES_OFFSET:_ROPE_OFFSET].contiguous().view(torch.float32)
    rope = rows[:, _ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    return torch.cat([(latent * scales.unsqueeze(-1)).reshape(-1, LATENT), rope], dim=1)


def sparse_mla_decode_reference(
    q: torch.Tensor, cache: torch.Tensor, topk_slots: torch.Tensor, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, 576], cache [num_blocks, bs, 656] uint8, topk_slots [B, K] -> out [B, H, 512], lse [B, H]."""
    rows = cache.reshape(-1, ROW_BYTES)
    valid = topk_slots >= 0
    kv = unpack_fp8_ds_mla_rows(rows[topk_slots.clamp(min=0).reshape(-1).long()]).reshape(
        *topk_slots.shape, LATENT + ROPE
    )
    scores = torch.einsum("bhd,bkd->bhk", q.float(), kv) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("bhk,bkd->bhd", probs, kv[..., :LATENT])
    return out.to(torch.bfloat16), lse


@triton.jit
def _load_q_group(q_ptr, row, h_ok, start: tl.constexpr, width: tl.constexpr, DOT_DTYPE: tl.constexpr):
    d = tl.arange(0, width)
    q = tl.load(q_ptr + row[:, None] * 576 + start + d[None, :], mask=h_ok[:, None], other=0.0)
    return q.to(DOT_DTYPE)


@triton.jit
def _load_rows(cache_u8, cache_f32, cache_bf16, topk_ptr, b, K, k0, k_end, BLOCK_K: tl.constexpr):
    """Raw bytes of BLOCK_K selected rows: 4 fp8 groups (uint8), 4 scales, rope (bf16)."""
    kk = k0 + tl.arange(0, BLOCK_K)
    idx = tl.load(topk_ptr + b * K + kk, mask=kk < k_end, other=-1)
    valid = idx >= 0
    slot = tl.where(valid, idx, 0).to(tl.int64)
    d = tl.arange(0, 128)
    lat = cache_u8 + slot[:, None] * 656 + d[None, :]
    r0 = tl.load(lat, mask=valid[:, None], other=0)
    r1 = tl.load(lat + 128, mask=valid[:, None], other=0)
    r2 = tl.load(lat + 256, mask=valid[:, None], other=0)
    r3 = tl.load(lat + 384, mask=valid[:, None], other=0)
    sc = cache_f32 + slot * 164 + 128
    s0 = tl.load(sc, mask=valid, other=0.0)
    s1 = tl.load(sc + 1, mask=valid, other=0.0)
    s2 = tl.load(sc + 2, mask=valid, other=0.0)
    s3 = tl.load(sc + 3, mask=valid, other=0.0)
    r = tl.arange(0, 64)
    rope = tl.load(cache_bf16 + slot[:, None] * 328 + 264 + r[None, :], mask=valid[:, None], other=0.0)
    return valid, r0, r1, r2, r3, s0, s1, s2, s3, rope


@triton.jit
def _pick(c, x0, x1, x2, x3, NCOL: tl.constexpr, J: tl.constexpr):
    """Value group J of column slice c, i.e. group c * (4 // NCOL) + J."""
    if NCOL == 1:
        y = x3
        if J == 0:
            y = x0
        if J == 1:
            y = x1
        if J == 2:
            y = x2
    elif NCOL == 2:
        if J == 0:
            y = tl.where(c == 0, x0, x2)
        else:
            y = tl.where(c == 0, x1, x3)
    else:
        y = tl.where(c == 0, x0, tl.where(c == 1, x1, tl.where(c == 2, x2, x3)))
    return y


@triton.jit
def _sparse_mla_decode_kernel(
    q_ptr, cache_u8, cache_f32, cache_bf16, topk_ptr, out_ptr, lse_ptr,
    B, H, K, k_per_split, qk_scale_log2,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, NCOL: tl.constexpr, PREFETCH: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    # One 656-B row is read through three views of the cache: 656 uint8 (fp8
    # latent at bytes 0..511), 164 fp32 (scales at words 128..131) and 328 bf16
    # (rope at 264..327).
    # Program = (value-column slice x head block, slice of the top-k list,
    # request). The NCOL column slices of one (request, split) recompute the
    # 576-wide scores but each keeps only 512 / NCOL output columns; they are
    # adjacent in launch order, so the rows they share come from L2. With more
    # than one top-k slice, partial outputs + LSEs go to a merge (same math as DCP).
    G_PER: tl.constexpr = 4 // NCOL
    col = tl.program_id(0) % NCOL
    h = (tl.program_id(0) // NCOL) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(1)
    b = tl.program_id(2)
    h_ok = h < H
    q_row = b * H + h
    q0 = _load_q_group(q_ptr, q_row, h_ok, 0, 128, DOT_DTYPE)
    q1 = _load_q_group(q_ptr, q_row, h_ok, 128, 128, DOT_DTYPE)
    q2 = _load_q_group(q_ptr, q_row, h_ok, 256, 128, DOT_DTYPE)
    q3 = _load_q_group(q_ptr, q_row, h_ok, 384, 128, DOT_DTYPE)
    q_rope = _load_q_group(q_ptr, q_row, h_ok, 512, 64, DOT_DTYPE)

    acc0 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_H, 128), dtype=tl.float32)
    # Finite initial max: a fully masked tile then gives p = 0, not NaN.
    m_i = tl.full((BLOCK_H,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    if PREFETCH:
        valid, r0, r1, r2, r3, s0, s1, s2, s3, rope = _load_rows(
            cache_u8, cache_f32, cache_bf16, topk_ptr, b, K, k_begin, k_end, BLOCK_K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if PREFETCH:
            # Register double buffer: the next tile's gathers are in flight during this tile's math.
            c_valid, c0, c1, c2, c3, cs0, cs1, cs2, cs3, c_rope = valid, r0, r1, r2, r3, s0, s1, s2, s3, rope
            valid, r0, r1, r2, r3, s0, s1, s2, s3, rope = _load_rows(
                cache_u8, cache_f32, cache_bf16, topk_ptr, b, K, k0 + BLOCK_K, k_end, BLOCK_K)
        else:
            c_valid, c0, c1, c2, c3, cs0, cs1, cs2, cs3, c_rope = _load_rows(
                cache_u8, cache_f32, cache_bf16, topk_ptr, b, K, k0, k_end, BLOCK_K)
        k_0 = c0.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
        k_1 = c1.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
        k_2 = c2.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
        k_3 = c3.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
        # Scales fold into the scores (q . (s k8) = s (q . k8)) and into P.
        scores = tl.dot(q0, tl.trans(k_0)) * cs0[None, :]
        scores += tl.dot(q1, tl.trans(k_1)) * cs1[None, :]
        scores += tl.dot(q2, tl.trans(k_2)) * cs2[None, :]
        scores += tl.dot(q3, tl.trans(k_3)) * cs3[None, :]
        scores += tl.dot(q_rope, tl.trans(c_rope.to(DOT_DTYPE)))
        scores = tl.where(c_valid[None, :], scores * qk_scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v0 = _pick(col, k_0, k_1, k_2, k_3, NCOL, 0)
        t0 = _pick(col, cs0, cs1, cs2, cs3, NCOL, 0)
        acc0 = acc0 * alpha[:, None] + tl.dot((p * t0[None, :]).to(DOT_DTYPE), v0)
        if G_PER >= 2:
            v1 = _pick(col, k_0, k_1, k_2, k_3, NCOL, 1)
            t1 = _pick(col, cs0, cs1, cs2, cs3, NCOL, 1)
            acc1 = acc1 * alpha[:, None] + tl.dot((p * t1[None, :]).to(DOT_DTYPE), v1)
        if G_PER == 4:
            acc2 = acc2 * alpha[:, None] + tl.dot((p * cs2[None, :]).to(DOT_DTYPE), k_2)
            acc3 = acc3 * alpha[:, None] + tl.dot((p * cs3[None, :]).to(DOT_DTYPE), k_3)
        m_i = m_new

    inv_l = tl.where(l_i > 0, 1.0 / l_i, 0.0)
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_i)) * 0.6931471805599453, float("-inf"))
    d = col * (512 // NCOL) + tl.arange(0, 128)
    # Slice `split` of [splits, B, H, ...] outputs; with one slice, that is [B, H, ...].
    base = out_ptr + (split * B * H + q_row)[:, None].to(tl.int64) * 512 + d[None, :]
    lse_at = lse_ptr + split * B * H + q_row
    tl.store(lse_at, lse, mask=h_ok & (col == 0))
    ty = out_ptr.dtype.element_ty
    tl.store(base, (acc0 * inv_l[:, None]).to(ty), mask=h_ok[:, None])
    if G_PER >= 2:
        tl.store(base + 128, (acc1 * inv_l[:, None]).to(ty), mask=h_ok[:, None])
    if G_PER == 4:
        tl.store(base + 256, (acc2 * inv_l[:, None]).to(ty), mask=h_ok[:, None])
        tl.store(base + 384, (acc3 * inv_l[:, None]).to(ty), mask=h_ok[:, None])


def sparse_mla_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    topk_slots: torch.Tensor,
    sm_scale: float,
    num_splits: int = 1,
    block_h: int = 64,
    block_k: int = 64,
    num_warps: int = 8,
    num_stages: int = 2,
    partial_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
    num_col_splits: int = 1,
    prefetch: bool = False,
    fp16_mma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`sparse_mla_decode_reference`.

    ``num_splits > 1`` splits the top-k list so that small batches still fill
    the GPU; the slices (stored as ``partial_dtype``) are combined by
    :func:`lse_merge`. ``num_col_splits`` (1, 2, 4) splits the 512 output
    columns across programs (each recomputes the scores); ``prefetch`` issues
    the next tile's row gathers before the current tile's math. ``fp16_mma`` runs the
    products on fp16 operands (the fp8 values convert exactly; q, rope and P are
    rounded to fp16, whose 10-bit mantissa is finer than bf16's but whose range ends
    at 65504): faster where the conversions dominate (few heads, the mma.sync path),
    slower on the wgmma path (64 heads), see docs/benchmarks.md.
    """
    batch, heads, dim = q.shape
    assert dim == LATENT + ROPE and cache.dtype == torch.uint8 and cache.shape[-1] == ROW_BYTES
    assert num_col_splits in (1, 2, 4)
    q = q.contiguous()
    topk_slots = topk_slots.contiguous()
    k = topk_slots.shape[1]
    block_h = max(16, min(block_h, triton.next_power_of_2(heads)))  # tl.dot needs M >= 16
    k_per_split = triton.cdiv(triton.cdiv(k, num_splits), block_k) * block_k
    num_splits = triton.cdiv(k, k_per_split)
    flat = cache.reshape(-1, ROW_BYTES)
    views = (flat, flat.view(torch.float32), flat.view(torch.bfloat16))
    grid = (num_col_splits * triton.cdiv(heads, block_h), num_splits, batch)
    # fp16 operands: e4m3 -> fp16 is one conversion per pair of values where bf16 needs three
    # (the pair goes through fp16 and fp32). The interpreter keeps its fp32 operands.
    dot_dtype = tl.float16 if fp16_mma and not interpreting() else bf16_dot_dtype()
    args = dict(BLOCK_H=block_h, BLOCK_K=block_k, NCOL=num_col_splits, PREFETCH=prefetch, DOT_DTYPE=dot_dtype,
                num_warps=num_warps, num_stages=num_stages)
    part, part_lse = slice_outputs(q, num_splits, partial_dtype, out, out_lse)
    _sparse_mla_decode_kernel[grid](q, *views, topk_slots, part, part_lse, batch, heads, k, k_per_split,
                                    sm_scale / math.log(2.0), **args)
    return _merge_slices(num_splits, part, part_lse, out, out_lse)


def slice_outputs(q, num_splits, partial_dtype, out, out_lse) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a decode kernel writes: with one slice of the top-k list, `out`/`out_lse` (or new
    [B, H, 512] bf16 / [B, H] fp32); with more, [slices, B, H, ...] partials for lse_merge."""
    batch, heads, _ = q.shape
    if num_splits == 1:
        return (out if out is not None else torch.empty((batch, heads, LATENT), dtype=torch.bfloat16, device=q.device),
                out_lse if out_lse is not None else torch.empty((batch, heads), dtype=torch.float32, device=q.device))
    return (torch.empty((num_splits, batch, heads, LATENT), dtype=partial_dtype, device=q.device),
            torch.empty((num_splits, batch, heads), dtype=torch.float32, device=q.device))


def _merge_slices(num_splits, part, part_lse, out, out_lse) -> tuple[torch.Tensor, torch.Tensor]:
    if num_splits == 1:
        return part, part_lse
    # One head a program: the decode grid (B x H programs) is small, and 4 heads a program took
    # 10.1 us for 8 slices at B=64, H=8 against 3.7 us (docs/benchmarks.md).
    return lse_merge(part, part_lse, out_dtype=torch.bfloat16, out=out, out_lse=out_lse, block_h=1)
