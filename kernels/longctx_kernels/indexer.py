"""DSA indexer for decode: fp8 key scores, then an exact per-request top-k.

score[b, t] = kscale[t] * sum_h w[b, h] * relu(q[b, h] . k[t])

Keys live in a paged cache of fp8 e4m3 rows (128 values) with one fp32 scale
per token (132 B per token, as DeepGEMM's ``fp8_paged_mqa_logits`` reads them);
q is fp8 too and its own scale is folded into ``w`` by the caller.

Top-k is a radix select: four 8-bit histogram passes over the row's logits find
the k-th largest key exactly, and a last pass writes the ids of every larger
element plus enough ties. Ids are unordered; slots past min(k, seq_len) are -1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn


def indexer_logits_reference(
    q_fp8: torch.Tensor,  # [B, H, D] fp8
    weights: torch.Tensor,  # [B, H] fp32
    k_fp8: torch.Tensor,  # [num_blocks, block_size, D] fp8
    k_scale: torch.Tensor,  # [num_blocks, block_size] fp32
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    max_len: int,
) -> torch.Tensor:
    """fp32 logits [B, max_len]; positions at or past seq_len are -inf."""
    batch = q_fp8.shape[0]
    bs = k_fp8.shape[1]
    logits = torch.full((batch, max_len), float("-inf"), dtype=torch.float32, device=q_fp8.device)
    for b in range(batch):
        n = int(seq_lens[b])
        pages = block_table[b, : triton.cdiv(n, bs)].long()
        k = k_fp8[pages].float().reshape(-1, k_fp8.shape[2])[:n]
        s = k_scale[pages].reshape(-1)[:n]
        scores = torch.relu(q_fp8[b].float() @ k.T)  # [H, n]
        logits[b, :n] = s * (weights[b].float() @ scores)
    return logits


def topk_reference(logits: torch.Tensor, seq_lens: torch.Tensor, k: int) -> torch.Tensor:
    """Ids of the k largest logits of each row within seq_len; -1 past min(k, seq_len)."""
    out = torch.full((logits.shape[0], k), -1, dtype=torch.int32, device=logits.device)
    for b in range(logits.shape[0]):
        n = int(seq_lens[b])
        kk = min(k, n)
        out[b, :kk] = torch.topk(logits[b, :n], kk).indices.int()
    return out


@triton.jit
def _indexer_logits_kernel(
    q_ptr, w_ptr, k_ptr, ks_ptr, bt_ptr, seq_lens_ptr, out_ptr,
    max_len, max_blocks,
    H: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PAGES_PER_PROG: tl.constexpr,
):
    # Program = (request, PAGES_PER_PROG pages). q is loaded once and reused for
    # every page; each page's 64 keys are one MMA tile [H, D] x [D, 64].
    b = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + b)
    first_page = tl.program_id(1) * PAGES_PER_PROG
    if first_page * BLOCK_SIZE >= seq_len:
        return
    h = tl.arange(0, H)
    d = tl.arange(0, D)
    t = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + b * H * D + h[:, None] * D + d[None, :]).to(tl.float8e4nv, bitcast=True)
    w = tl.load(w_ptr + b * H + h)
    for p in tl.static_range(PAGES_PER_PROG):
        page = first_page + p
        pos = page * BLOCK_SIZE + t
        valid = pos < seq_len
        block = tl.load(bt_ptr + b * max_blocks + page, mask=page < max_blocks, other=0).to(tl.int64)
        k = tl.load(
            k_ptr + block * (BLOCK_SIZE * D) + t[:, None] * D + d[None, :], mask=valid[:, None], other=0
        ).to(tl.float8e4nv, bitcast=True)
        scale = tl.load(ks_ptr + block * BLOCK_SIZE + t, mask=valid, other=0.0)
        scores = tl.dot(q, tl.trans(k))  # fp8 MMA (sm_89+), fp32 [H, BLOCK_SIZE]
        logits = tl.sum(tl.maximum(scores, 0.0) * w[:, None], axis=0) * scale
        logits = tl.where(valid, logits, float("-inf"))
        tl.store(out_ptr + b * max_len + pos, logits, mask=pos < max_len)


@triton.jit
def _fill_neg_inf_tail_kernel(out_ptr, seq_lens_ptr, max_len, BLOCK: tl.constexpr):
    # Pages past seq_len are skipped by the logits kernel; their slots still
    # need -inf so that the output is fully defined.
    b = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + b)
    start = (seq_len // BLOCK) * BLOCK
    for t0 in range(start, max_len, BLOCK):
        pos = t0 + tl.arange(0, BLOCK)
        tl.store(out_ptr + b * max_len + pos, float("-inf"), mask=(pos >= seq_len) & (pos < max_len))


def indexer_logits(
    q_fp8, weights, k_fp8, k_scale, block_table, seq_lens, max_len: int,
    pages_per_prog: int = 4, num_warps: int = 4, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of :func:`indexer_logits_reference` (GPU path needs sm_89+ for fp8 MMA)."""
    batch, heads, dim = q_fp8.shape
    block_size = k_fp8.shape[1]
    if out is None:
        out = torch.empty((batch, max_len), dtype=torch.float32, device=q_fp8.device)
    grid = (batch, triton.cdiv(triton.cdiv(max_len, block_size), pages_per_prog))
    _indexer_logits_kernel[grid](
        q_fp8.view(torch.uint8), weights.float().contiguous(), k_fp8.view(torch.uint8), k_scale,
        block_table, seq_lens, out, max_len, block_table.shape[1],
        H=heads, D=dim, BLOCK_SIZE=block_size, PAGES_PER_PROG=pages_per_prog,
        num_warps=num_warps,
    )
    _fill_neg_inf_tail_kernel[(batch,)](out, seq_lens, max_len, BLOCK=block_size * pages_per_prog)
    return out


@triton.jit
def _ordered_key(x):
    # Map fp32 to uint32 so that unsigned order equals float order.
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _radix_topk_kernel(
    logits_ptr, seq_lens_ptr, out_ptr, max_len,
    K: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + b)
    k_eff = tl.minimum(seq_len, K)
    row = logits_ptr + b * max_len
    bins = tl.arange(0, 512)
    prefix = tl.zeros((), dtype=tl.uint32)
    prefix_mask = tl.zeros((), dtype=tl.uint32)
    remaining = k_eff
    for pass_id in tl.static_range(4):
        shift = 24 - 8 * pass_id
        hist = tl.zeros((512,), dtype=tl.int32)
        for t0 in range(0, seq_len, BLOCK):
            pos = t0 + tl.arange(0, BLOCK)
            key = _ordered_key(tl.load(row + pos, mask=pos < seq_len, other=0.0))
            candidate = (pos < seq_len) & ((key & prefix_mask) == prefix)
            # Bins in descending digit order; non-candidates go to the spare upper half.
            bin_id = tl.where(candidate, 255 - ((key >> shift) & 0xFF).to(tl.int32), 256)
            hist += tl.histogram(bin_id, 512)
        cum = tl.cumsum(hist, 0)
        chosen = tl.min(tl.where((cum >= remaining) & (bins < 256), bins, 511))
        remaining -= tl.sum(tl.where(bins < chosen, hist, 0))
        prefix = prefix | ((255 - chosen).to(tl.uint32) << shift)
        prefix_mask = prefix_mask | (tl.full((), 0xFF, tl.uint32) << shift)
    # prefix is now the k-th largest key: take all larger keys and `remaining` ties.
    num_greater = k_eff - remaining
    taken_greater = 0
    taken_equal = 0
    for t0 in range(0, seq_len, BLOCK):
        pos = t0 + tl.arange(0, BLOCK)
        key = _ordered_key(tl.load(row + pos, mask=pos < seq_len, other=0.0))
        greater = ((pos < seq_len) & (key > prefix)).to(tl.int32)
        equal = ((pos < seq_len) & (key == prefix)).to(tl.int32)
        slot_g = taken_greater + tl.cumsum(greater, 0) - 1
        slot_e = num_greater + taken_equal + tl.cumsum(equal, 0) - 1
        tl.store(out_ptr + b * K + slot_g, pos, mask=greater != 0)
        tl.store(out_ptr + b * K + slot_e, pos, mask=(equal != 0) & (slot_e < k_eff))
        taken_greater += tl.sum(greater)
        taken_equal += tl.sum(equal)
    for s0 in range(0, K, BLOCK):
        slot = s0 + tl.arange(0, BLOCK)
        tl.store(out_ptr + b * K + slot, -1, mask=(slot >= k_eff) & (slot < K))


def radix_topk(
    logits: torch.Tensor, seq_lens: torch.Tensor, k: int, block: int = 4096, num_warps: int = 16,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of :func:`topk_reference` (int32 ids, unordered)."""
    batch, max_len = logits.shape
    if out is None:
        out = torch.empty((batch, k), dtype=torch.int32, device=logits.device)
    _radix_topk_kernel[(batch,)](logits.contiguous(), seq_lens, out, max_len, K=k, BLOCK=block, num_warps=num_warps)
    return out


def indexer_topk(q_fp8, weights, k_fp8, k_scale, block_table, seq_lens, max_len: int, k: int = 2048):
    """Decode indexer: logits then top-k ids [B, k]."""
    logits = indexer_logits(q_fp8, weights, k_fp8, k_scale, block_table, seq_lens, max_len)
    return radix_topk(logits, seq_lens, k)
