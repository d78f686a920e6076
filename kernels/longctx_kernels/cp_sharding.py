"""Context-parallel token placement.

PCP (prefill): a prompt of T tokens is cut into 2N chunks of C = ceil(T / 2N)
tokens; rank r takes chunks r and 2N-1-r ("head-tail" pairing). Under causal
attention chunk c costs ~c, so every rank gets the same work: r + (2N-1-r).
Shards are laid out rank-major as ``[N, 2C, D]``: rows 0..C-1 hold the head
chunk, rows C..2C-1 the tail chunk; rows past the end of the prompt are padding
(zero-filled) and dropped again by the inverse.

DCP (decode KV): with interleave size I, token t lives on rank (t // I) % N at
local position (t // (N*I)) * I + t % I (vLLM ``cp_kv_cache_interleave_size``).
:func:`dcp_local_positions` turns global token ids (e.g. top-k ids) into the
rank's local positions, -1 where another rank owns the token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def pcp_chunk_size(num_tokens: int, num_ranks: int) -> int:
    return triton.cdiv(num_tokens, 2 * num_ranks)


def pcp_rank_token_ids(num_tokens: int, num_ranks: int, rank: int) -> torch.Tensor:
    """Global token ids held by `rank`, in shard order (head chunk, then tail chunk)."""
    c = pcp_chunk_size(num_tokens, num_ranks)
    # Short prompts leave trailing chunks empty, so clamp both ends to T.
    chunks = (rank, 2 * num_ranks - 1 - rank)
    return torch.cat([torch.arange(min(i * c, num_tokens), min((i + 1) * c, num_tokens)) for i in chunks])


def pcp_shard_reference(x: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """x [T, D] -> rank-major padded shards [N, 2C, D] (padding rows are 0)."""
    t, d = x.shape
    c = pcp_chunk_size(t, num_ranks)
    out = torch.zeros((num_ranks, 2 * c, d), dtype=x.dtype, device=x.device)
    for r in range(num_ranks):
        for half, chunk in enumerate((r, 2 * num_ranks - 1 - r)):
            rows = x[chunk * c : min((chunk + 1) * c, t)]
            out[r, half * c : half * c + rows.shape[0]] = rows
    return out


def pcp_unshard_reference(shards: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Inverse of :func:`pcp_shard_reference`: [N, 2C, D] -> [T, D]."""
    num_ranks = shards.shape[0]
    out = torch.empty((num_tokens, shards.shape[2]), dtype=shards.dtype, device=shards.device)
    for r in range(num_ranks):
        ids = pcp_rank_token_ids(num_tokens, num_ranks, r).to(shards.device)
        out[ids] = shards[r, : ids.numel()]
    return out


@triton.jit
def _pcp_token_of_shard_row(rank, row, num_ranks, chunk, num_tokens):
    in_tail = row >= chunk
    chunk_id = tl.where(in_tail, 2 * num_ranks - 1 - rank, rank)
    token = chunk_id * chunk + tl.where(in_tail, row - chunk, row)
    return token, token < num_tokens


@triton.jit
def _pcp_shard_kernel(
    x_ptr, out_ptr, num_tokens, num_ranks, chunk, D,
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Grid: (N * 2C / BLOCK_ROWS,): each program fills BLOCK_ROWS shard rows.
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    rank = rows // (2 * chunk)
    token, valid = _pcp_token_of_shard_row(rank, rows % (2 * chunk), num_ranks, chunk, num_tokens)
    row_ok = rows < num_ranks * 2 * chunk
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        d_ok = d[None, :] < D
        vals = tl.load(x_ptr + token[:, None].to(tl.int64) * D + d[None, :], mask=valid[:, None] & d_ok, other=0)
        tl.store(out_ptr + rows[:, None].to(tl.int64) * D + d[None, :], vals, mask=row_ok[:, None] & d_ok)


@triton.jit
def _pcp_unshard_kernel(
    shards_ptr, out_ptr, num_tokens, num_ranks, chunk, D,
    BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    chunk_id = token // chunk
    in_tail = chunk_id >= num_ranks
    rank = tl.where(in_tail, 2 * num_ranks - 1 - chunk_id, chunk_id)
    row = rank * 2 * chunk + tl.where(in_tail, chunk, 0) + token % chunk
    ok = token < num_tokens
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d[None, :] < D)
        vals = tl.load(shards_ptr + row[:, None].to(tl.int64) * D + d[None, :], mask=mask)
        tl.store(out_ptr + token[:, None].to(tl.int64) * D + d[None, :], vals, mask=mask)


_BLOCK_ROWS = 16


def pcp_shard(x: torch.Tensor, num_ranks: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of :func:`pcp_shard_reference`."""
    x = x.contiguous()
    t, d = x.shape
    c = pcp_chunk_size(t, num_ranks)
    if out is None:
        out = torch.empty((num_ranks, 2 * c, d), dtype=x.dtype, device=x.device)
    block_d = min(triton.next_power_of_2(d), 1024)
    grid = (triton.cdiv(num_ranks * 2 * c, _BLOCK_ROWS),)
    _pcp_shard_kernel[grid](x, out, t, num_ranks, c, d, BLOCK_ROWS=_BLOCK_ROWS, BLOCK_D=block_d)
    return out


def pcp_unshard(shards: torch.Tensor, num_tokens: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of :func:`pcp_unshard_reference`."""
    shards = shards.contiguous()
    num_ranks, two_c, d = shards.shape
    assert two_c == 2 * pcp_chunk_size(num_tokens, num_ranks)
    if out is None:
        out = torch.empty((num_tokens, d), dtype=shards.dtype, device=shards.device)
    block_d = min(triton.next_power_of_2(d), 1024)
    grid = (triton.cdiv(num_tokens, _BLOCK_ROWS),)
    _pcp_unshard_kernel[grid](shards, out, num_tokens, num_ranks, two_c // 2, d, BLOCK_ROWS=_BLOCK_ROWS, BLOCK_D=block_d)
    return out


def dcp_owner_reference(token_ids: torch.Tensor, num_ranks: int, interleave: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Global token ids -> (owning rank, local position on that rank)."""
    rank = (token_ids // interleave) % num_ranks
    local = (token_ids // (num_ranks * interleave)) * interleave + token_ids % interleave
    return rank, local


def dcp_local_positions_reference(
    token_ids: torch.Tensor, rank: int, num_ranks: int, interleave: int = 1
) -> torch.Tensor:
    """Local positions on `rank` of global ids; -1 for ids another rank owns or ids < 0."""
    owner, local = dcp_owner_reference(token_ids.clamp(min=0), num_ranks, interleave)
    return torch.where((owner == rank) & (token_ids >= 0), local, -1).to(token_ids.dtype)


@triton.jit
def _dcp_local_positions_kernel(ids_ptr, out_ptr, n, rank, num_ranks, interleave, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t = tl.load(ids_ptr + offs, mask=mask, other=-1)
    owner = (t // interleave) % num_ranks
    local = (t // (num_ranks * interleave)) * interleave + t % interleave
    tl.store(out_ptr + offs, tl.where((owner == rank) & (t >= 0), local, -1), mask=mask)


def dcp_local_positions(
    token_ids: torch.Tensor, rank: int, num_ranks: int, interleave: int = 1, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Triton version of :func:`dcp_local_positions_reference` (any shape, int32/int64)."""
    ids = token_ids.contiguous()
    if out is None:
        out = torch.empty_like(ids)
    block = 1024
    _dcp_local_positions_kernel[(triton.cdiv(ids.numel(), block),)](
        ids, out, ids.numel(), rank, num_ranks, interleave, BLOCK=block
    )
    return out
