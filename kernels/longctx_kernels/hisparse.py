"""HiSparse: selected KV rows that are not on the GPU are fetched from pinned host memory.

Each decode request owns a GPU *hot buffer* of S row slots. Per step, the
indexer's top-k names host rows; :class:`HotBufferLRU` decides which of them
are already in the hot buffer (hits), which slots the others (misses) evict
(least recently used first), and returns the copy list. :func:`gather_rows`
then copies the missed 656-B rows straight from the pinned host pool into the
hot buffer: a Triton kernel reading host memory over PCIe through its device
mapping (UVA, zero-copy), with no cudaMemcpy per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass
class SwapPlan:
    """Result of :meth:`HotBufferLRU.resolve` for one request.

    hot_slots: [K] hot-buffer slot of each top-k entry (-1 where the entry was -1).
    src_rows / dst_slots: the misses to copy, host row -> hot slot; src_rows
    ascending (host order), so gather_rows needs no sort for one request's list.
    """

    hot_slots: torch.Tensor
    src_rows: torch.Tensor
    dst_slots: torch.Tensor


class HotBufferLRU:
    """Residency of host rows in one request's hot buffer, with LRU eviction.

    State: ``slot_row[s]`` is the host row held by slot s (-1: empty) and
    ``lru`` lists all slots from least to most recently used. Empty slots start
    at the LRU end, so they are filled before anything is evicted. A step's
    rows must fit: at most S distinct rows per resolve.
    """

    def __init__(self, num_slots: int, device: torch.device | str = "cpu"):
        self.slot_row = torch.full((num_slots,), -1, dtype=torch.int64, device=device)
        self.lru = torch.arange(num_slots, dtype=torch.int64, device=device)

    def resolve(self, host_rows: torch.Tensor) -> SwapPlan:
        valid = host_rows >= 0
        wanted, inverse = torch.unique(host_rows[valid].long(), return_inverse=True)
        if wanted.numel() > self.slot_row.numel():
            raise ValueError(f"{wanted.numel()} distinct rows do not fit in {self.slot_row.numel()} slots")
        # Walk slots in LRU order; a slot is a hit if it holds a wanted row.
        rows_in_lru_order = self.slot_row[self.lru]
        hit_in_lru = torch.isin(rows_in_lru_order, wanted) & (rows_in_lru_order >= 0)
        hit_slots = self.lru[hit_in_lru]
        evictable = self.lru[~hit_in_lru]
        missing = wanted[~torch.isin(wanted, self.slot_row[hit_slots])]
        # The oldest evictable slots take the misses.
        new_slots = evictable[: missing.numel()]
        self.slot_row[new_slots] = missing
        # Most recently used last: untouched evictables, then new rows, then hits.
        self.lru = torch.cat([evictable[missing.numel():], new_slots, hit_slots])
        # Resident slots hold exactly the wanted rows; sorting them by row lines
        # them up with `wanted`, which torch.unique returned sorted.
        resident = torch.cat([hit_slots, new_slots])
        slot_of_wanted = resident[torch.argsort(self.slot_row[resident])]
        hot_slots = torch.full_like(host_rows, -1, dtype=torch.int64)
        hot_slots[valid] = slot_of_wanted[inverse]
        return SwapPlan(hot_slots=hot_slots, src_rows=missing, dst_slots=new_slots)


def gather_rows_reference(host_pool: torch.Tensor, src_rows: torch.Tensor, hot: torch.Tensor, dst_rows: torch.Tensor) -> None:
    """hot[dst_rows] = host_pool[src_rows] (rows of bytes)."""
    hot[dst_rows.long().to(hot.device)] = host_pool[src_rows.long().cpu()].to(hot.device)


@triton.jit
def _gather_rows_kernel(
    src_ptr, dst_ptr, src_rows_ptr, dst_rows_ptr, num_rows,
    ROW_WORDS: tl.constexpr, ROWS_PER_PROG: tl.constexpr, BLOCK_WORDS: tl.constexpr,
):
    # Rows are 16-B aligned (656 B = 41 x 16 B) and copied as 32-bit words, so
    # each thread's 4 consecutive words can become one 16-B access. Many rows
    # per program keep enough bytes in flight to cover the PCIe round trip.
    i = tl.program_id(0) * ROWS_PER_PROG + tl.arange(0, ROWS_PER_PROG)
    ok = i < num_rows
    src = tl.load(src_rows_ptr + i, mask=ok, other=0).to(tl.int64)
    dst = tl.load(dst_rows_ptr + i, mask=ok, other=0).to(tl.int64)
    w = tl.arange(0, BLOCK_WORDS)
    mask = ok[:, None] & (w[None, :] < ROW_WORDS)
    vals = tl.load(src_ptr + src[:, None] * ROW_WORDS + w[None, :], mask=mask, cache_modifier=".cg")
    tl.store(dst_ptr + dst[:, None] * ROW_WORDS + w[None, :], vals, mask=mask, cache_modifier=".cg")


@triton.jit
def _gather_vecs_kernel(
    src_ptr, dst_ptr, src_rows_ptr, dst_rows_ptr, num_vecs,
    VECS_PER_ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    # The copy as a flat list of 16-B vectors (row i, vector j): no masked-off
    # lanes (a 656-B row is 41 vectors, not a power of two), consecutive lanes
    # read consecutive 16 B of a row, and BLOCK vectors (many rows) are in
    # flight per program.
    v = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = v < num_vecs
    i = v // VECS_PER_ROW
    j = v % VECS_PER_ROW
    src = tl.load(src_rows_ptr + i, mask=ok, other=0).to(tl.int64)
    dst = tl.load(dst_rows_ptr + i, mask=ok, other=0).to(tl.int64)
    w = tl.arange(0, 4)
    vals = tl.load(src_ptr + ((src * VECS_PER_ROW + j) * 4)[:, None] + w[None, :], mask=ok[:, None],
                   cache_modifier=".cg")
    tl.store(dst_ptr + ((dst * VECS_PER_ROW + j) * 4)[:, None] + w[None, :], vals, mask=ok[:, None],
             cache_modifier=".cg")


@triton.jit
def _bucket_count_kernel(src_rows_ptr, counts_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    b = (tl.load(src_rows_ptr + i, mask=ok, other=0) >> SHIFT).to(tl.int32)
    tl.atomic_add(counts_ptr + b, tl.full([BLOCK], 1, tl.int32), mask=ok)


@triton.jit
def _bucket_scan_kernel(counts_ptr, num_buckets, BLOCK: tl.constexpr):
    # One program: counts -> exclusive prefix sums, in place (the bucket start cursors).
    carry = tl.zeros([], dtype=tl.int32)
    for start in range(0, num_buckets, BLOCK):
        k = start + tl.arange(0, BLOCK)
        ok = k < num_buckets
        c = tl.load(counts_ptr + k, mask=ok, other=0)
        tl.store(counts_ptr + k, tl.cumsum(c, 0) - c + carry, mask=ok)
        carry += tl.sum(c, 0)


@triton.jit
def _bucket_scatter_kernel(src_rows_ptr, dst_rows_ptr, cursor_ptr, out_src_ptr, out_dst_ptr, n,
                           SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    src = tl.load(src_rows_ptr + i, mask=ok, other=0)
    dst = tl.load(dst_rows_ptr + i, mask=ok, other=0)
    pos = tl.atomic_add(cursor_ptr + (src >> SHIFT).to(tl.int32), tl.full([BLOCK], 1, tl.int32), mask=ok)
    tl.store(out_src_ptr + pos, src.to(tl.int32), mask=ok)
    tl.store(out_dst_ptr + pos, dst.to(tl.int32), mask=ok)


def bucket_by_host_row(src_rows: torch.Tensor, dst_rows: torch.Tensor, num_pool_rows: int, shift: int = 10,
                       block: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Counting sort of the copy list by ``src_row >> shift`` (coarse host order), as int32.

    Only the bucket order matters for host-address locality: rows of one bucket
    (2**shift rows, 672 KB of 656-B rows at shift 10) stay in arrival order.
    Three small launches (count, scan, scatter) instead of a full radix sort:
    25 us for 131K rows of a 4M-row pool on an H200, vs 86 us for an int64
    torch.sort plus the dst gather (docs/benchmarks.md).
    Returns (src, dst) permuted alike; every (src, dst) pair is kept.
    """
    assert num_pool_rows < 2**31 and src_rows.numel() < 2**31
    n = src_rows.numel()
    num_buckets = ((num_pool_rows - 1) >> shift) + 1
    counts = torch.zeros(num_buckets, dtype=torch.int32, device=src_rows.device)
    out_src = torch.empty(n, dtype=torch.int32, device=src_rows.device)
    out_dst = torch.empty(n, dtype=torch.int32, device=src_rows.device)
    grid = (triton.cdiv(n, block),)
    _bucket_count_kernel[grid](src_rows, counts, n, SHIFT=shift, BLOCK=block, num_warps=4)
    _bucket_scan_kernel[(1,)](counts, num_buckets, BLOCK=min(4096, triton.next_power_of_2(num_buckets)), num_warps=8)
    _bucket_scatter_kernel[grid](src_rows, dst_rows, counts, out_src, out_dst, n, SHIFT=shift, BLOCK=block,
                                 num_warps=4)
    return out_src, out_dst


def gather_rows(
    host_pool: torch.Tensor, src_rows: torch.Tensor, hot: torch.Tensor, dst_rows: torch.Tensor,
    rows_per_prog: int = 16, num_warps: int = 4, vec_block: int | None = None, sort_src: bool | str = False,
    bucket_shift: int = 10,
) -> None:
    """Triton version of :func:`gather_rows_reference`.

    host_pool: [R, row_bytes] uint8, pinned (page-locked) host memory when
    ``hot`` is on the GPU; row_bytes a multiple of 16. src_rows/dst_rows: int
    tensors on hot's device. ``vec_block`` set: the flat 16-B-vector kernel
    with that many vectors per program; else one program per ``rows_per_prog`` rows.
    ``sort_src``: copy in host-row order. Random rows of a large pool reach
    about half the PCIe rate; in host order, close to the copy engine's
    (docs/benchmarks.md). ``True`` or ``"bucket"``: coarse order, a counting
    sort by ``src_row >> bucket_shift`` (:func:`bucket_by_host_row`);
    ``"sort"``: a full device sort (int32 keys where they fit). Lists that are
    already in host order (:meth:`HotBufferLRU.resolve` emits its misses sorted,
    one request at a time) need neither.
    """
    row_bytes = host_pool.shape[1]
    assert row_bytes % 16 == 0 and hot.shape[1] == row_bytes
    assert host_pool.is_contiguous() and hot.is_contiguous()
    if hot.is_cuda:
        assert host_pool.is_cuda or host_pool.is_pinned(), "host pool must be pinned for zero-copy reads"
    n = src_rows.numel()
    if n == 0:
        return
    if sort_src == "sort":
        if host_pool.shape[0] < 2**31:
            src_rows = src_rows.int()
        src_rows, order = torch.sort(src_rows)
        dst_rows = dst_rows[order]
    elif sort_src:
        assert sort_src is True or sort_src == "bucket", sort_src
        src_rows, dst_rows = bucket_by_host_row(src_rows, dst_rows, host_pool.shape[0], bucket_shift)
    words = row_bytes // 4
    if vec_block is not None:
        vecs = n * (row_bytes // 16)
        _gather_vecs_kernel[(triton.cdiv(vecs, vec_block),)](
            host_pool.view(torch.int32), hot.view(torch.int32), src_rows, dst_rows, vecs,
            VECS_PER_ROW=row_bytes // 16, BLOCK=vec_block, num_warps=num_warps,
        )
        return
    _gather_rows_kernel[(triton.cdiv(n, rows_per_prog),)](
        host_pool.view(torch.int32), hot.view(torch.int32), src_rows, dst_rows, n,
        ROW_WORDS=words, ROWS_PER_PROG=rows_per_prog, BLOCK_WORDS=triton.next_power_of_2(words),
        num_warps=num_warps,
    )
