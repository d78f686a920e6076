"""Sparse MLA decode over the top-k rows of an fp8 paged KV cache.

Row layout (``fp8_ds_mla``, 656 B per token): 512 fp8 e4m3 latent values,
4 fp32 scales (one per group of 128 latent values), 64 bf16 rope values. The
cache is ``uint8 [num_blocks, block_size, 656]``; top-k ids are physical slots
``block * block_size + offset`` (-1 = no token). The query is absorbed:
``q [B, H, 576]`` bf16 (512 latent + 64 rope); V is the dequantized latent.

The kernel dequantizes each tile once (fp8 * group scale, rounded to bf16, as
FlashMLA's fp8 sparse decode does) and feeds it to two dots: the 576-wide
scores and the 512-wide P @ V.
Outputs: ``out [B, H, 512]`` bf16 and ``lse [B, H]`` fp32 in base e (-inf
where no valid token was selected, with out = 0: the merge's identity).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._runtime import bf16_dot_dtype
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
def _sparse_mla_decode_kernel(
    q_ptr, cache_u8, cache_f32, cache_bf16, topk_ptr, out_ptr, lse_ptr,
    B, H, K, k_per_split, qk_scale_log2, num_hblocks,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_OUTPUT: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    # One 656-B row is read through three views of the cache: 656 uint8 (fp8
    # latent at bytes 0..511), 164 fp32 (scales at words 128..131) and 328 bf16
    # (rope at 264..327).
    # Program = (request x head block, slice of the top-k list) (split-K /
    # flash-decoding). With more than one slice, partial outputs + LSEs go to
    # the LSE merge (same math as DCP).
    # Per tile the fp8 latent [BLOCK_K, 512] is loaded with one 2-D load,
    # dequantized once (fp8 -> bf16, times its bf16-rounded group scale: the same
    # rounding as FlashMLA's dequantize-to-smem) and used by two large dots:
    # S = q[:, :512] @ kv^T + q[:, 512:] @ rope^T  and  acc += P @ kv.
    pid = tl.program_id(0)
    b = pid // num_hblocks
    h = (pid % num_hblocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(1)
    h_ok = h < H
    q_row = b * H + h
    d = tl.arange(0, 512)
    r = tl.arange(0, 64)
    q_lat = tl.load(q_ptr + q_row[:, None] * 576 + d[None, :], mask=h_ok[:, None], other=0.0).to(DOT_DTYPE)
    q_rope = tl.load(q_ptr + q_row[:, None] * 576 + 512 + r[None, :], mask=h_ok[:, None], other=0.0).to(DOT_DTYPE)

    acc = tl.zeros((BLOCK_H, 512), dtype=tl.float32)
    # Finite initial max: a fully masked tile then gives p = 0, not NaN.
    m_i = tl.full((BLOCK_H,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    g = tl.arange(0, 4)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        idx = tl.load(topk_ptr + b * K + kk, mask=kk < k_end, other=-1)
        valid = idx >= 0
        slot = tl.where(valid, idx, 0).to(tl.int64)
        lat = tl.load(cache_u8 + slot[:, None] * 656 + d[None, :], mask=valid[:, None], other=0)
        sc = tl.load(cache_f32 + slot[:, None] * 164 + 128 + g[None, :], mask=valid[:, None], other=0.0)
        k_rope = tl.load(cache_bf16 + slot[:, None] * 328 + 264 + r[None, :], mask=valid[:, None], other=0.0)
        # fp8 -> bf16 is exact; the product with the bf16-rounded scale is
        # rounded once. Staying in bf16 halves the registers the tile takes.
        kv = tl.reshape(lat.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE), (BLOCK_K, 4, 128))
        kv = tl.reshape(kv * sc.to(DOT_DTYPE)[:, :, None], (BLOCK_K, 512))

        scores = tl.dot(q_lat, tl.trans(kv))
        scores = tl.dot(q_rope, tl.trans(k_rope.to(DOT_DTYPE)), scores)
        scores = tl.where(valid[None, :], scores * qk_scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(DOT_DTYPE), kv, acc * alpha[:, None])
        m_i = m_new

    inv_l = tl.where(l_i > 0, 1.0 / l_i, 0.0)
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_i)) * 0.6931471805599453, float("-inf"))
    if SPLIT_OUTPUT:
        base = out_ptr + (split * B * H + q_row)[:, None].to(tl.int64) * 512 + d[None, :]
        tl.store(lse_ptr + split * B * H + q_row, lse, mask=h_ok)
    else:
        base = out_ptr + q_row[:, None].to(tl.int64) * 512 + d[None, :]
        tl.store(lse_ptr + q_row, lse, mask=h_ok)
    tl.store(base, (acc * inv_l[:, None]).to(out_ptr.dtype.element_ty), mask=h_ok[:, None])


def sparse_mla_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    topk_slots: torch.Tensor,
    sm_scale: float,
    num_splits: int = 1,
    block_h: int = 64,
    block_k: int = 32,
    num_warps: int = 8,
    num_stages: int = 2,
    partial_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`sparse_mla_decode_reference`.

    ``num_splits > 1`` splits the top-k list so that small batches still fill
    the GPU; the slices (stored as ``partial_dtype``) are combined by
    :func:`lse_merge`.
    """
    batch, heads, dim = q.shape
    assert dim == LATENT + ROPE and cache.dtype == torch.uint8 and cache.shape[-1] == ROW_BYTES
    q = q.contiguous()
    topk_slots = topk_slots.contiguous()
    k = topk_slots.shape[1]
    block_h = max(16, min(block_h, triton.next_power_of_2(heads)))  # tl.dot needs M >= 16
    k_per_split = triton.cdiv(triton.cdiv(k, num_splits), block_k) * block_k
    num_splits = triton.cdiv(k, k_per_split)
    flat = cache.reshape(-1, ROW_BYTES)
    views = (flat, flat.view(torch.float32), flat.view(torch.bfloat16))
    num_hblocks = triton.cdiv(heads, block_h)
    grid = (batch * num_hblocks, num_splits)
    args = dict(BLOCK_H=block_h, BLOCK_K=block_k, DOT_DTYPE=bf16_dot_dtype(), num_warps=num_warps, num_stages=num_stages)
    qk_scale_log2 = sm_scale / math.log(2.0)
    if num_splits == 1:
        if out is None:
            out = torch.empty((batch, heads, LATENT), dtype=torch.bfloat16, device=q.device)
        if out_lse is None:
            out_lse = torch.empty((batch, heads), dtype=torch.float32, device=q.device)
        _sparse_mla_decode_kernel[grid](q, *views, topk_slots, out, out_lse, batch, heads, k, k_per_split,
                                        qk_scale_log2, num_hblocks, SPLIT_OUTPUT=False, **args)
        return out, out_lse
    part = torch.empty((num_splits, batch, heads, LATENT), dtype=partial_dtype, device=q.device)
    part_lse = torch.empty((num_splits, batch, heads), dtype=torch.float32, device=q.device)
    _sparse_mla_decode_kernel[grid](q, *views, topk_slots, part, part_lse, batch, heads, k, k_per_split,
                                    qk_scale_log2, num_hblocks, SPLIT_OUTPUT=True, **args)
    return lse_merge(part, part_lse, out_dtype=torch.bfloat16, out=out, out_lse=out_lse)
