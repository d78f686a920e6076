import pytest
import torch

from longctx_kernels.indexer import (
    FP8,
    indexer_logits,
    indexer_logits_reference,
    radix_topk,
    topk_reference,
)

from .conftest import relative_error


def _paged_keys(batch, heads, seq_lens, gen, block_size=64, dim=128):
    pages = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(pages) + 3
    q = torch.randn(batch, heads, dim, generator=gen).to(FP8)
    weights = torch.rand(batch, heads, generator=gen)
    k = torch.randn(num_blocks, block_size, dim, generator=gen).to(FP8)
    k_scale = torch.rand(num_blocks, block_size, generator=gen) + 0.01
    # Pages of each request are scattered through the pool, as in a paged cache.
    perm = torch.randperm(num_blocks, generator=gen).int()
    table = torch.zeros(batch, max(pages), dtype=torch.int32)
    start = 0
    for b, p in enumerate(pages):
        table[b, :p] = perm[start : start + p]
        start += p
    return q, weights, k, k_scale, table, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize("unroll", [True, False])
@pytest.mark.parametrize("heads,seq_lens", [(16, [300, 513]), (32, [64, 1]), (64, [700])])
def test_indexer_logits_match_reference(heads, seq_lens, unroll, gen):
    q, w, k, ks, table, lens = _paged_keys(len(seq_lens), heads, seq_lens, gen)
    max_len = table.shape[1] * 64
    out = torch.full((len(seq_lens), max_len), float("nan"))
    indexer_logits(q, w, k, ks, table, lens, max_len, pages_per_prog=2, out=out, unroll=unroll)
    ref = indexer_logits_reference(q, w, k, ks, table, lens, max_len)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out))  # -inf exactly past seq_len, nothing unwritten
    assert relative_error(out[finite], ref[finite]) < 1e-5  # fp8 inputs are exact; fp32 accumulation


@pytest.mark.parametrize("chunk", [None, 512])
@pytest.mark.parametrize("k,seq_lens", [(128, [1000, 129, 128]), (256, [100, 3000]), (64, [4096])])
def test_radix_topk_selects_the_k_largest(k, seq_lens, chunk, gen):
    max_len = max(seq_lens) + 17
    logits = torch.randn(len(seq_lens), max_len, generator=gen)
    logits[0, :50] = logits[0, 50]  # ties at the threshold must be handled too
    logits[:, 7] = float("-inf")
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = torch.full((len(seq_lens), k), -12345, dtype=torch.int32)
    radix_topk(logits, lens, k, block=256, num_warps=4, out=out, chunk=chunk)
    ref = topk_reference(logits, lens, k)
    for b, n in enumerate(seq_lens):
        kk = min(k, n)
        got = out[b, :kk].long()
        assert (out[b, kk:] == -1).all()
        assert got.unique().numel() == kk and (got >= 0).all() and (got < n).all()
        # Ties make the ids ambiguous; the selected values are not.
        assert torch.equal(logits[b, got].sort().values, logits[b, ref[b, :kk].long()].sort().values)
