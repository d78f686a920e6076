import pytest
import torch

from longctx_kernels.hisparse import HotBufferLRU, gather_rows, gather_rows_reference


def test_lru_hits_misses_and_eviction_order():
    lru = HotBufferLRU(num_slots=4)
    plan = lru.resolve(torch.tensor([10, 11, -1, 10]))
    assert sorted(plan.src_rows.tolist()) == [10, 11]  # duplicates are fetched once
    assert plan.hot_slots[0] == plan.hot_slots[3] and plan.hot_slots[2] == -1
    lru.resolve(torch.tensor([12, 13]))  # fills the last two empty slots
    plan = lru.resolve(torch.tensor([10, 14]))  # 10 hits; 14 evicts the least recently used row, 11
    assert plan.src_rows.tolist() == [14]
    assert lru.slot_row[plan.dst_slots].tolist() == [14] and 11 not in lru.slot_row.tolist()
    assert sorted(lru.slot_row.tolist()) == [10, 12, 13, 14]
    plan = lru.resolve(torch.tensor([10, 14]))  # all hits: nothing to copy
    assert plan.src_rows.numel() == 0


def test_lru_plan_and_gather_keep_hot_buffer_consistent(gen):
    row_bytes, num_slots = 656, 64
    pool = torch.randint(0, 256, (2000, row_bytes), generator=gen, dtype=torch.uint8)
    hot = torch.randint(0, 256, (num_slots, row_bytes), generator=gen, dtype=torch.uint8)
    lru = HotBufferLRU(num_slots)
    for _ in range(8):
        rows = torch.randint(0, 150, (48,), generator=gen)
        rows[:5] = -1
        plan = lru.resolve(rows)
        expected = hot.clone()
        gather_rows_reference(pool, plan.src_rows, expected, plan.dst_slots)
        gather_rows(pool, plan.src_rows, hot, plan.dst_slots, rows_per_prog=8)
        assert torch.equal(hot, expected)
        assert torch.equal(plan.src_rows, plan.src_rows.sort().values)  # misses come in host order
        valid = rows >= 0
        assert torch.equal(hot[plan.hot_slots[valid]], pool[rows[valid]])
        assert sorted(lru.lru.tolist()) == list(range(num_slots))


@pytest.mark.parametrize("vec_block,sort_src", [(None, False), (128, False), (128, True), (128, "sort"), (None, "bucket")])
def test_gather_writes_every_byte_of_each_row(vec_block, sort_src, gen):
    pool = torch.randint(0, 256, (300, 656), generator=gen, dtype=torch.uint8)
    src = torch.randperm(300, generator=gen)[:77]
    dst = torch.randperm(100, generator=gen)[:77]
    hot = (~pool[0]).repeat(100, 1)  # poison: differs from the pool in every byte of row 0
    hot[dst] = ~pool[src]  # every destination byte differs from its source before the copy
    gather_rows(pool, src, hot, dst, rows_per_prog=16, vec_block=vec_block, sort_src=sort_src)
    assert torch.equal(hot[dst], pool[src])


@pytest.mark.parametrize("pool_rows,shift", [(300, 4), (9000, 0), (5000, 20)])
def test_bucket_by_host_row_is_a_bucket_ordered_permutation(pool_rows, shift, gen):
    from longctx_kernels.hisparse import bucket_by_host_row

    n = min(pool_rows, 2500)
    src = torch.randperm(pool_rows, generator=gen)[:n]
    dst = torch.randperm(n, generator=gen)
    out_src, out_dst = bucket_by_host_row(src, dst, pool_rows, shift, block=256)
    assert out_src.dtype == torch.int32 and out_dst.dtype == torch.int32
    buckets = out_src.long() >> shift
    assert bool((buckets[1:] >= buckets[:-1]).all())
    # the same (src, dst) pairs, each once
    assert torch.equal(out_src.long()[out_dst.long().argsort()], src[dst.argsort()])
    assert sorted(out_dst.tolist()) == list(range(n))
