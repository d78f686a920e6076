"""DSA indexer for decode: fp8 key scores, then an exact per-request top-k.

score[b, t] = kscale[t] * sum_h w[b, h] * relu(q[b, h] . k[t])

Keys live in a paged cache of fp8 e4m3 rows (128 values) with one fp32 scale
per token (132 B per token, as DeepGEMM's ``fp8_paged_mqa_logits`` reads them);
q is fp8 too and its own scale is folded into ``w`` by the caller.

Top-k is a radix select: four 8-bit histogram passes over the row's logits find
the k-th largest key exactly, and a last pass writes the ids of every larger
element plus enough ties. Each pass runs as many programs per request (one per
chunk of the row), whose histograms meet in global memory through atomics. Ids are unordered; slots past min(k, seq_len) are -1.
"""

from __future__ import annotations

import ctypes

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
    PAGES_PER_PROG: tl.constexpr, UNROLL: tl.constexpr,
):
    # Program = (request, PAGES_PER_PROG pages). q and w are loaded once and
    # reused for every page; each page's 64 keys are one fp8 MMA tile
    # [64, D] x [D, H]. The page loop is unrolled (UNROLL) or a runtime loop
    # that Triton's pipeliner can software-pipeline (num_stages).
    b = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + b)
    first_page = tl.program_id(1) * PAGES_PER_PROG
    if first_page * BLOCK_SIZE >= seq_len:
        return
    h = tl.arange(0, H)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * H * D + h[:, None] * D + d[None, :]).to(tl.float8e4nv, bitcast=True)
    w = tl.load(w_ptr + b * H + h)
    if UNROLL:
        for p in tl.static_range(PAGES_PER_PROG):
            _indexer_page(k_ptr, ks_ptr, bt_ptr, out_ptr, q, w, b, first_page + p, seq_len, max_len, max_blocks,
                          D, BLOCK_SIZE)
    else:
        last_page = tl.minimum(first_page + PAGES_PER_PROG, tl.cdiv(seq_len, BLOCK_SIZE))
        for page in range(first_page, last_page):
            _indexer_page(k_ptr, ks_ptr, bt_ptr, out_ptr, q, w, b, page, seq_len, max_len, max_blocks,
                          D, BLOCK_SIZE)


@triton.jit
def _indexer_page(k_ptr, ks_ptr, bt_ptr, out_ptr, q, w, b, page, seq_len, max_len, max_blocks,
                  D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    # Keys are the MMA's M side: scores^T = k [64, D] x q^T [D, H], so the sum
    # over heads is a reduction along each thread's own row (no cross-warp
    # shared-memory reduction, as a sum over the M axis would need).
    t = tl.arange(0, BLOCK_SIZE)
    d = tl.arange(0, D)
    pos = page * BLOCK_SIZE + t
    valid = pos < seq_len
    block = tl.load(bt_ptr + b * max_blocks + page, mask=page < max_blocks, other=0).to(tl.int64)
    k = tl.load(
        k_ptr + block * (BLOCK_SIZE * D) + t[:, None] * D + d[None, :], mask=valid[:, None], other=0
    ).to(tl.float8e4nv, bitcast=True)
    scale = tl.load(ks_ptr + block * BLOCK_SIZE + t, mask=valid, other=0.0)
    scores = tl.dot(k, tl.trans(q))  # fp8 MMA (sm_89+), fp32 [BLOCK_SIZE, H]
    logits = tl.sum(tl.maximum(scores, 0.0) * w[None, :], axis=1) * scale
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
    pages_per_prog: int = 8, num_warps: int = 4, out: torch.Tensor | None = None, num_stages: int = 3, unroll: bool = True,
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
        H=heads, D=dim, BLOCK_SIZE=block_size, PAGES_PER_PROG=pages_per_prog, UNROLL=unroll,
        num_warps=num_warps, num_stages=num_stages,
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


@triton.jit
def _prefix_from_hists(hist_ptr, b, B, k_eff, NUM_PASSES: tl.constexpr):
    # Replays the digit choices of the finished passes from their row
    # histograms (bins in descending digit order): the k-th largest key's top
    # 8*NUM_PASSES bits, and how many of the k are still to be found among the
    # keys that share them.
    bins = tl.arange(0, 256)
    prefix = tl.zeros((), dtype=tl.uint32)
    remaining = k_eff
    for p in tl.static_range(NUM_PASSES):
        hist = tl.load(hist_ptr + (p * B + b) * 256 + bins)
        cum = tl.cumsum(hist, 0)
        chosen = tl.min(tl.where(cum >= remaining, bins, 255))
        remaining -= tl.sum(tl.where(bins < chosen, hist, 0))
        prefix = prefix | ((255 - chosen).to(tl.uint32) << (24 - 8 * p))
    return prefix, remaining


@triton.jit
def _radix_hist_kernel(
    logits_ptr, seq_lens_ptr, hist_ptr, B, max_len,
    K: tl.constexpr, PASS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    # Program = (request, chunk of its logits): histogram of digit PASS of the
    # keys that still match the prefix, added into the row's histogram.
    b = tl.program_id(0)
    c0 = tl.program_id(1) * CHUNK
    seq_len = tl.load(seq_lens_ptr + b)
    if c0 >= seq_len:
        return
    k_eff = tl.minimum(seq_len, K)
    prefix, remaining = _prefix_from_hists(hist_ptr, b, B, k_eff, PASS)
    shift = 24 - 8 * PASS
    prefix_mask = (0xFFFFFFFF << (32 - 8 * PASS)) & 0xFFFFFFFF
    row = logits_ptr + b * max_len
    # 256 bins only (Triton's histogram costs grow with the bin count):
    # non-candidates are counted into bin 0, and taken out again below.
    hist = tl.zeros((256,), dtype=tl.int32)
    others = tl.zeros((), dtype=tl.int32)
    for t0 in range(c0, tl.minimum(c0 + CHUNK, seq_len), BLOCK):
        pos = t0 + tl.arange(0, BLOCK)
        ok = pos < seq_len
        key = _ordered_key(tl.load(row + pos, mask=ok, other=0.0))
        candidate = ok & ((key & prefix_mask) == prefix)
        bin_id = tl.where(candidate, 255 - ((key >> shift) & 0xFF).to(tl.int32), 0)
        hist += tl.histogram(bin_id, 256)
        others += tl.sum((~candidate).to(tl.int32))
    bins = tl.arange(0, 256)
    hist = tl.where(bins == 0, hist - others, hist)
    tl.atomic_add(hist_ptr + (PASS * B + b) * 256 + bins, hist, mask=hist > 0)


@triton.jit
def _radix_collect_kernel(
    logits_ptr, seq_lens_ptr, hist_ptr, count_ptr, out_ptr, B, max_len,
    K: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    # Program = (request, chunk): ids of keys above the k-th largest go to
    # slots [0, num_greater) and ties to [num_greater, k_eff), each block of
    # them placed by one atomic on the row's counters.
    b = tl.program_id(0)
    c0 = tl.program_id(1) * CHUNK
    seq_len = tl.load(seq_lens_ptr + b)
    k_eff = tl.minimum(seq_len, K)
    if tl.program_id(1) == 0:
        for s0 in range(0, K, BLOCK):
            slot = s0 + tl.arange(0, BLOCK)
            tl.store(out_ptr + b * K + slot, -1, mask=(slot >= k_eff) & (slot < K))
    if c0 >= seq_len:
        return
    prefix, remaining = _prefix_from_hists(hist_ptr, b, B, k_eff, 4)
    num_greater = k_eff - remaining
    row = logits_ptr + b * max_len
    for t0 in range(c0, tl.minimum(c0 + CHUNK, seq_len), BLOCK):
        pos = t0 + tl.arange(0, BLOCK)
        ok = pos < seq_len
        key = _ordered_key(tl.load(row + pos, mask=ok, other=0.0))
        greater = (ok & (key > prefix)).to(tl.int32)
        equal = (ok & (key == prefix)).to(tl.int32)
        n_g = tl.sum(greater)
        n_e = tl.sum(equal)
        if n_g > 0:
            base_g = tl.atomic_add(count_ptr + 2 * b, n_g)
            slot_g = base_g + tl.cumsum(greater, 0) - 1
            tl.store(out_ptr + b * K + slot_g, pos, mask=greater != 0)
        if n_e > 0:
            base_e = tl.atomic_add(count_ptr + 2 * b + 1, n_e)
            slot_e = num_greater + base_e + tl.cumsum(equal, 0) - 1
            tl.store(out_ptr + b * K + slot_e, pos, mask=(equal != 0) & (slot_e < k_eff))


def radix_topk(
    logits: torch.Tensor, seq_lens: torch.Tensor, k: int, block: int = 4096, num_warps: int = 16,
    out: torch.Tensor | None = None, chunk: int | None = 4096,
) -> torch.Tensor:
    """Triton version of :func:`topk_reference` (int32 ids, unordered).

    ``chunk`` set: the multi-program radix select, (request, chunk of `chunk`
    logits) programs per pass, row histograms combined with atomics (four
    histogram launches + one collect launch). ``chunk=None``: the first
    version, one program per request doing all five passes.
    """
    batch, max_len = logits.shape
    logits = logits.contiguous()
    if out is None:
        out = torch.empty((batch, k), dtype=torch.int32, device=logits.device)
    if chunk is None:
        _radix_topk_kernel[(batch,)](logits, seq_lens, out, max_len, K=k, BLOCK=block, num_warps=num_warps)
        return out
    block = min(block, chunk)
    work = torch.zeros(4 * batch * 256 + 2 * batch, dtype=torch.int32, device=logits.device)
    hist, counts = work[: 4 * batch * 256], work[4 * batch * 256 :]
    grid = (batch, triton.cdiv(max_len, chunk))
    for p in range(4):
        _radix_hist_kernel[grid](logits, seq_lens, hist, batch, max_len, K=k, PASS=p, CHUNK=chunk, BLOCK=block,
                                 num_warps=num_warps)
    _radix_collect_kernel[grid](logits, seq_lens, hist, counts, out, batch, max_len, K=k, CHUNK=chunk, BLOCK=block,
                                num_warps=num_warps)
    return out


def indexer_topk(q_fp8, weights, k_fp8, k_scale, block_table, seq_lens, max_len: int, k: int = 2048):
    """Decode indexer: logits then top-k ids [B, k]."""
    logits = indexer_logits(q_fp8, weights, k_fp8, k_scale, block_table, seq_lens, max_len)
    return radix_topk(logits, seq_lens, k)


def radix_topk_cuda(logits: torch.Tensor, seq_lens: torch.Tensor, k: int, out: torch.Tensor | None = None,
                    row_batch: int = 4, list_cap: int = 8192, ctas_per_row: int | None = None) -> torch.Tensor:
    """The hand-written CUDA version of :func:`radix_topk` (csrc/radix_topk.cu): a pass over the
    row lists the ids above a threshold taken from a sample, then rounds of 2048 bins fitted to the
    listed keys' range select among them, in one CTA a row. A thread loads `row_batch` float4
    chunks at a time (up to 6 fit in 64 registers without spills). The lists live in shared
    memory, `list_cap` (key, id) entries each; a longer one is re-read from the row, so no scratch
    memory grows with the row length. With `ctas_per_row` > 1 (by default when the batch leaves SMs
    idle and rows are longer than 64K), that many CTAs a row list the candidates first, into
    `list_cap` global entries a row. Logits must be finite or -inf."""
    from .cuda_module import load

    batch, max_len = logits.shape
    assert logits.dtype == torch.float32 and seq_lens.dtype == torch.int32
    logits = logits.contiguous()
    if out is None:
        out = torch.empty((batch, k), dtype=torch.int32, device=logits.device)
    if ctas_per_row is None:
        sms = torch.cuda.get_device_properties(logits.device).multi_processor_count
        ctas_per_row = max(1, min(sms // batch, triton.cdiv(max_len, 65536)))
    defines = (("TOPK_ROW_BATCH", row_batch), ("TOPK_LIST_CAP", list_cap))
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    stream = torch.cuda.current_stream(logits.device).cuda_stream
    candidates, meta = None, None
    if ctas_per_row > 1:
        candidates = torch.empty((batch, list_cap, 2), dtype=torch.int32, device=logits.device)
        meta = torch.zeros((batch, 3), dtype=torch.int32, device=logits.device)  # count, tau, largest key
        lister = load("radix_topk.cu", "radix_topk_candidates", logits.device.index, defines)
        lister.launch((ctas_per_row, batch, 1), 1024, [
            (logits.data_ptr(), ptr), (seq_lens.data_ptr(), ptr), (max_len, i32), (k, i32),
            (candidates.data_ptr(), ptr), (meta.data_ptr(), ptr), (list_cap, i32)], stream)
    kernel = load("radix_topk.cu", "radix_topk_rows", logits.device.index, defines)
    kernel.launch((batch, 1, 1), 1024, [
        (logits.data_ptr(), ptr), (seq_lens.data_ptr(), ptr), (out.data_ptr(), ptr), (max_len, i32), (k, i32),
        (candidates.data_ptr() if candidates is not None else 0, ptr), (meta.data_ptr() if meta is not None else 0, ptr),
        (list_cap, i32)], stream)
    return out
