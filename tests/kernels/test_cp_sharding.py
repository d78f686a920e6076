import pytest
import torch

from longctx_kernels.cp_sharding import (
    dcp_local_positions,
    dcp_local_positions_reference,
    dcp_owner_reference,
    pcp_chunk_size,
    pcp_rank_token_ids,
    pcp_shard,
    pcp_shard_reference,
    pcp_unshard,
    pcp_unshard_reference,
)


def test_pcp_rank_chunks_follow_head_tail_pairing():
    # PCP=4, 8 tokens of 1 per chunk: rank 0 -> chunks 0,7; rank 3 -> chunks 3,4.
    assert pcp_rank_token_ids(8, 4, 0).tolist() == [0, 7]
    assert pcp_rank_token_ids(8, 4, 3).tolist() == [3, 4]
    # Every token on exactly one rank, also when T is not a multiple of 2N.
    ids = torch.cat([pcp_rank_token_ids(37, 3, r) for r in range(3)])
    assert sorted(ids.tolist()) == list(range(37))


@pytest.mark.parametrize("num_tokens,num_ranks,dim", [(64, 2, 16), (37, 3, 24), (5, 4, 8), (1000, 8, 7)])
def test_pcp_shard_and_unshard_match_reference(num_tokens, num_ranks, dim, gen):
    x = torch.randn(num_tokens, dim, generator=gen)
    c = pcp_chunk_size(num_tokens, num_ranks)
    shards = torch.full((num_ranks, 2 * c, dim), float("nan"))
    pcp_shard(x, num_ranks, out=shards)
    assert torch.equal(shards, pcp_shard_reference(x, num_ranks))
    back = torch.full((num_tokens, dim), float("nan"))
    pcp_unshard(shards, num_tokens, out=back)
    assert torch.equal(back, x)
    assert torch.equal(pcp_unshard_reference(shards, num_tokens), x)


@pytest.mark.parametrize("num_ranks,interleave", [(2, 1), (4, 1), (8, 16), (3, 4)])
def test_dcp_local_positions_match_reference(num_ranks, interleave, gen):
    ids = torch.randint(-1, 5000, (5, 300), generator=gen, dtype=torch.int32)
    for rank in range(num_ranks):
        out = torch.full_like(ids, -12345)
        dcp_local_positions(ids, rank, num_ranks, interleave, out=out)
        assert torch.equal(out, dcp_local_positions_reference(ids, rank, num_ranks, interleave))


def test_dcp_placement_is_round_robin_and_dense():
    t = torch.arange(64)
    rank, local = dcp_owner_reference(t, num_ranks=4, interleave=2)
    assert rank[:10].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    for r in range(4):  # each rank's tokens fill local positions 0..15 in order
        assert local[rank == r].tolist() == list(range(16))
