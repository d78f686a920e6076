"""Kernel benchmark on one H200 (plus the DCP KV all-gather overlap on 2 GPUs when present).

For every kernel: correctness against its PyTorch reference at the full shape,
then the median of CUDA-event timings, printed next to its physical floor for
that shape (bytes over the HBM/PCIe bandwidth measured in this same run, FLOPs
over the bf16 matmul rate measured in this run) and the fraction achieved
(floor / time). Run:  PYTHONPATH=kernels python3 benchmarks/kernels_bench.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
import traceback

import torch
import triton

from longctx_kernels import measure
from longctx_kernels.measure import exact_topk, relative_error as rel_err
from longctx_kernels.cp_sharding import dcp_local_positions, dcp_local_positions_reference, pcp_shard, pcp_shard_reference, pcp_unshard
from longctx_kernels.hisparse import bucket_by_host_row, gather_rows
from longctx_kernels.indexer import FP8, indexer_logits, indexer_logits_reference, radix_topk, radix_topk_cuda
from longctx_kernels.lse_merge import lse_merge, lse_merge_reference
from longctx_kernels.sparse_mla import (pack_fp8_ds_mla_rows, sparse_mla_decode, sparse_mla_decode_cuda,
                                        sparse_mla_decode_reference)

ROWS: list[dict] = []
CEIL: dict[str, float] = {}


def row(kernel, shape, ms, bytes_=0.0, flops=0.0, link="HBM", check="", note=""):
    bw = CEIL["pcie_h2d"] if link == "PCIe" else CEIL["hbm"]
    t_bytes = bytes_ / bw * 1e6
    t_flops = flops / CEIL["bf16"] * 1e6
    floor = max(t_bytes, t_flops)
    bound = link if t_bytes >= t_flops else "bf16 MMA"
    r = dict(kernel=kernel, shape=shape, time_us=ms * 1e3, floor_us=floor, bound=bound,
             fraction=floor / (ms * 1e3), check=check, note=note)
    ROWS.append(r)
    print(f"  {kernel:28s} {shape:40s} {ms*1e3:9.1f} us  floor {floor:8.1f} us ({bound})  "
          f"{r['fraction']*100:5.1f}%  {check}  {note}", flush=True)
    return r


def best(configs, make_fn):
    """Time every config; return (best ms, best config)."""
    results = []
    for cfg in configs:
        try:
            ms = measure.graph_median_ms(make_fn(cfg))
            results.append((ms, cfg))
            print(f"    config {cfg}: {ms*1e3:.1f} us", flush=True)
        except Exception as exc:
            print(f"    config {cfg}: failed {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
    return min(results, key=lambda x: x[0])


def bench_ceilings():
    CEIL["hbm"] = measure.hbm_copy_bandwidth(4 << 30)
    CEIL["pcie_h2d"] = measure.pinned_copy_bandwidth(2 << 30, to_device=True)
    CEIL["pcie_d2h"] = measure.pinned_copy_bandwidth(2 << 30, to_device=False)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    CEIL["bf16"] = 2 * 8192**3 / (measure.median_ms(lambda: a @ b) * 1e-3)
    del a, b
    one = torch.empty(1, device="cuda")
    CEIL["launch_us"] = 1e3 * measure.median_ms(lambda: one.fill_(1.0), iters=50)
    CEIL["graph_node_us"] = 1e3 * measure.graph_median_ms(lambda: one.fill_(1.0))
    print(f"ceilings: HBM copy {CEIL['hbm']/1e12:.2f} TB/s, pinned H2D {CEIL['pcie_h2d']/1e9:.1f} GB/s, "
          f"D2H {CEIL['pcie_d2h']/1e9:.1f} GB/s, bf16 matmul {CEIL['bf16']/1e12:.0f} TFLOP/s, "
          f"1-element kernel: {CEIL['launch_us']:.1f} us launched from Python, {CEIL['graph_node_us']:.1f} us "
          f"in a CUDA graph", flush=True)


def bench_lse_merge():
    for n, b, h in [(8, 64, 8), (2, 64, 64), (8, 8, 8)]:
        d = 512
        part = torch.randn(n, b, h, d, device="cuda").bfloat16()
        lse = torch.randn(n, b, h, device="cuda") * 3
        lse[0, :, 0] = -math.inf
        out = torch.full((b, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        lse_merge(part, lse, out=out)
        err = rel_err(out, lse_merge_reference(part, lse)[0])
        ms, cfg = best([1, 2, 4, 8], lambda bh: (lambda: lse_merge(part, lse, block_h=bh, out=out)))
        bytes_ = n * b * h * (2 * d + 4) + b * h * (2 * d + 4)
        row("lse_merge (DCP combine)", f"N={n} B={b} H={h} D={d} bf16", ms, bytes_, 4 * n * b * h * d,
            check=f"err {err:.1e}", note=f"block_h={cfg}; 1-elt kernel in a graph {CEIL['graph_node_us']:.1f} us")


def bench_cp_sharding():
    t, n = 131072, 8
    x = torch.randn(t, 576, device="cuda").bfloat16()
    ok = torch.equal(pcp_shard(x, n), pcp_shard_reference(x, n)) and torch.equal(pcp_unshard(pcp_shard(x, n), t), x)
    ms = measure.graph_median_ms(lambda: pcp_shard(x, n))
    row("pcp_shard", f"T={t} N={n} row 1152 B", ms, 2 * x.numel() * 2, check="exact" if ok else "WRONG")
    shards = pcp_shard(x, n)
    ms = measure.graph_median_ms(lambda: pcp_unshard(shards, t))
    row("pcp_unshard", f"T={t} N={n} row 1152 B", ms, 2 * x.numel() * 2, check="exact" if ok else "WRONG")
    ids = torch.randint(0, 65536, (64, 2048), device="cuda", dtype=torch.int32)
    ok = torch.equal(dcp_local_positions(ids, 3, 8), dcp_local_positions_reference(ids, 3, 8))
    ms = measure.graph_median_ms(lambda: dcp_local_positions(ids, 3, 8))
    row("dcp_local_positions", "B=64 K=2048 N=8", ms, 8 * ids.numel(), check="exact" if ok else "WRONG")


def make_indexer_inputs(batch, seq_len, heads, gen):
    bs = 64
    pages = seq_len // bs
    q = torch.randn(batch, heads, 128, device="cuda", generator=gen).to(FP8)
    w = torch.rand(batch, heads, device="cuda", generator=gen)
    k = torch.randn(batch * pages, bs, 128, device="cuda", generator=gen).to(FP8)
    ks = torch.rand(batch * pages, bs, device="cuda", generator=gen) + 0.01
    table = torch.randperm(batch * pages, device="cuda", generator=gen).int().reshape(batch, pages)
    lens = torch.full((batch,), seq_len, device="cuda", dtype=torch.int32)
    return q, w, k, ks, table, lens


def bench_indexer(gen):
    batch, seq_len, heads, topk = 64, 65536, 64, 2048
    q, w, k, ks, table, lens = make_indexer_inputs(batch, seq_len, heads, gen)
    logits = indexer_logits(q, w, k, ks, table, lens, seq_len)
    ref = indexer_logits_reference(q, w, k, ks, table, lens, seq_len)
    err = rel_err(logits, ref)
    del ref
    # Before (first version, 2026-11-30): 8 pages/program, 4 warps, statically unrolled page loop: 276.8 us.
    # (pages/program, warps, stages, unrolled page loop)
    cfgs = [(p, 4, 1, True) for p in (4, 8, 16)] + [(8, 8, 1, True), (16, 4, 2, False), (32, 4, 3, False)]
    ms, cfg = best(cfgs, lambda c: (lambda: indexer_logits(q, w, k, ks, table, lens, seq_len, pages_per_prog=c[0],
                                                           num_warps=c[1], num_stages=c[2], unroll=c[3], out=logits)))
    key_bytes = batch * seq_len * 132
    io_bytes = batch * heads * (128 + 4) + 4 * batch * seq_len
    row("indexer_logits (fp8)", f"B={batch} L=64K H_I={heads}", ms, key_bytes + io_bytes,
        2 * batch * heads * 128 * seq_len, check=f"err {err:.1e}",
        note=f"pages/prog,warps,stages,unrolled={cfg}; FLOP floor at bf16 rate (fp8 is 2x); DeepGEMM 149 us")
    # Multi-program radix select: (chunk, block, warps); then the first version (one program per request).
    ms_t, cfg_t = best([(4096, 4096, 8), (2048, 2048, 8), (2048, 2048, 4), (8192, 4096, 8), (1024, 1024, 4)],
                       lambda c: (lambda: radix_topk(logits, lens, topk, c[1], c[2], chunk=c[0])))
    ids = radix_topk(logits, lens, topk, cfg_t[1], cfg_t[2], chunk=cfg_t[0])
    topk_ok = exact_topk(logits, ids)
    row("radix_topk 2048", f"B={batch} L=64K", ms_t, 4 * batch * seq_len + 4 * batch * topk,
        check="exact set" if topk_ok else "WRONG", note=f"chunk,block,warps={cfg_t}; 5 launches, logits L2-resident")
    ms_single = measure.graph_median_ms(lambda: radix_topk(logits, lens, topk, 8192, 16, chunk=None))
    print(f"    (first version, one program per request: {ms_single*1e3:.1f} us)")
    out_c = torch.empty((batch, topk), dtype=torch.int32, device="cuda")
    # (row batch, list capacity): the lists take 8 B an entry of shared memory, which L1 then lacks.
    ms_c, (row_batch, list_cap) = best([(2, 8192), (4, 8192), (4, 4096)], lambda c: (
        lambda: radix_topk_cuda(logits, lens, topk, out=out_c, row_batch=c[0], list_cap=c[1])))
    out_c.fill_(-7)  # poisoned: an unwritten slot fails
    cuda_ok = exact_topk(logits, radix_topk_cuda(logits, lens, topk, out=out_c, row_batch=row_batch, list_cap=list_cap))
    row("radix_topk 2048 (CUDA)", f"B={batch} L=64K", ms_c, 4 * batch * seq_len + 4 * batch * topk,
        check="exact set" if cuda_ok else "WRONG", note=f"csrc/radix_topk.cu: one 1024-thread CTA per row, sampled threshold, "
        f"one pass listing candidates, fitted 2048-bin rounds, row batch {row_batch}, lists of {list_cap}; Triton {ms_t*1e3:.1f} us in the same run")
    # The mission's context: 1M logits a row (random).
    long_logits = torch.randn(batch, 1 << 20, device="cuda", generator=gen)
    long_lens = torch.full((batch,), 1 << 20, device="cuda", dtype=torch.int32)
    long_ok = exact_topk(long_logits, radix_topk_cuda(long_logits, long_lens, topk, row_batch=row_batch,
                                                      list_cap=list_cap))
    ms_long, _ = best([(row_batch, list_cap), (4, 8192)], lambda c: (
        lambda: radix_topk_cuda(long_logits, long_lens, topk, row_batch=c[0], list_cap=c[1])))
    ms_long_torch = measure.graph_median_ms(lambda: torch.topk(long_logits, topk, dim=1))
    row("radix_topk 2048 (CUDA)", f"B={batch} L=1M", ms_long, 4 * batch * (1 << 20) + 4 * batch * topk,
        check="exact set" if long_ok else "WRONG", note=f"random logits; torch.topk {ms_long_torch*1e3:.1f} us")
    # A small batch at 1M tokens: one CTA a row, against the default (CTAs a row listing candidates).
    for b_small in (1, 4):
        lg, ln = long_logits[:b_small], long_lens[:b_small]
        ok_small = exact_topk(lg, radix_topk_cuda(lg, ln, topk))
        ms_one = measure.graph_median_ms(lambda: radix_topk_cuda(lg, ln, topk, ctas_per_row=1))
        ms_small = measure.graph_median_ms(lambda: radix_topk_cuda(lg, ln, topk))
        row("radix_topk 2048 (CUDA)", f"B={b_small} L=1M", ms_small, 4 * b_small * (1 << 20) + 4 * b_small * topk,
            check="exact set" if ok_small else "WRONG",
            note=f"default CTAs a row listing candidates; one CTA a row {ms_one*1e3:.1f} us")
    del long_logits
    ms_torch = measure.graph_median_ms(lambda: torch.topk(logits, topk, dim=1))
    row("torch.topk 2048 (reference point)", f"B={batch} L=64K", ms_torch, 4 * batch * seq_len + 8 * batch * topk,
        check="", note="values + int64 ids, sorted")
    if cuda_ok:
        select = lambda lg: radix_topk_cuda(lg, lens, topk, out=out_c, row_batch=row_batch, list_cap=list_cap)  # noqa: E731
    else:
        select = lambda lg: radix_topk(lg, lens, topk, cfg_t[1], cfg_t[2], chunk=cfg_t[0])  # noqa: E731
    ms_all = measure.graph_median_ms(lambda: select(indexer_logits(q, w, k, ks, table, lens, seq_len, cfg[0], cfg[1],
                                                                   num_stages=cfg[2], unroll=cfg[3], out=logits)))
    row("indexer logits + top-k", f"B={batch} L=64K H_I={heads} K={topk}", ms_all,
        key_bytes + io_bytes + 4 * batch * seq_len, check="",
        note=f"top-k by {'CUDA' if cuda_ok else 'Triton'}; DeepGEMM logits alone: 149 us")


# Sparse-MLA config: (block_h, splits, warps, stages, block_k, column slices, prefetch, fp16 MMA); bf16 partials.
# The first config of each list is the third round's best (bf16 MMA), the baseline of the fourth.
def _mla_cfgs(heads):
    if heads == 8:
        cfgs = [(16, 4, 4, 2, 16, 1, True, False), (16, 4, 4, 2, 16, 1, True, True)]
        cfgs += [(16, s, 8, st, bk, 1, True, True) for s in (2, 3, 4) for st in (1, 2) for bk in (32, 64)]
        # CUDA: (splits, tile, stages, teams, producers, CTAs/SM); the default first.
        cfgs += [("cuda", 2, 64, 3, 2, 2, 1), ("cuda", 2, 32, 6, 2, 2, 1), ("cuda", 2, 64, 3, 3, 2, 1),
                 ("cuda", 2, 64, 3, 2, 1, 1), ("cuda", 4, 32, 3, 1, 2, 2)]
        return cfgs
    return [(64, 2, 8, 3, 64, 1, False, False), (64, 2, 8, 3, 64, 1, False, True)]


def _mla_name(cfg):
    if cfg[0] == "cuda":
        return (f"CUDA kernel (csrc/sparse_mla_decode.cu), {cfg[1]} splits (one cluster), tile {cfg[2]}, "
                f"{cfg[3]} stages, {cfg[4]} teams, {cfg[5]} producers, {cfg[6]} CTAs/SM")
    bh, s, nw, st, bk, nc, pf, f16 = cfg
    return (f"block_h {bh}, {s} splits, {nw} warps, {st} stages, block_k {bk}, {nc} column slices, prefetch {pf}, "
            f"{'fp16' if f16 else 'bf16'} MMA")


def _mla_call(cfg, q, cache, slots, sm_scale, out=None, **cuda_options):
    if cfg[0] == "cuda":
        return sparse_mla_decode_cuda(q, cache, slots, sm_scale, num_splits=cfg[1], tile=cfg[2], stages=cfg[3],
                                      teams=cfg[4], producers=cfg[5], ctas_per_sm=cfg[6], out=out, **cuda_options)
    bh, s, nw, st, bk, nc, pf, f16 = cfg
    return sparse_mla_decode(q, cache, slots, sm_scale, num_splits=s, block_h=bh, num_warps=nw, num_stages=st,
                             block_k=bk, partial_dtype=torch.bfloat16, out=out, num_col_splits=nc, prefetch=pf,
                             fp16_mma=f16)


def _mla_precompile(job):
    """Runs in a spawned process: compile (and run once, on a tiny cache) configs so that the
    parent finds them in Triton's on-disk cache. Same int arguments = same specialization."""
    heads, cfgs = job
    torch.cuda.init()
    cache = pack_fp8_ds_mla_rows(torch.randn(128, 576, device="cuda")).reshape(2, 64, 656)
    slots = torch.randint(0, 128, (64, 2048), device="cuda", dtype=torch.int32)
    q = torch.randn(64, heads, 576, device="cuda").bfloat16()
    failed = []
    for cfg in cfgs:
        try:
            _mla_call(cfg, q, cache, slots, 576**-0.5)
        except Exception as exc:  # the parent reports it when it runs the config
            failed.append(f"{cfg}: {type(exc).__name__}")
    torch.cuda.synchronize()
    return failed


def _mla_precompile_all(jobs, workers=12):
    import concurrent.futures as cf
    import multiprocessing as mp
    start = time.time()
    flat = [(h, [c]) for h, cfgs in jobs for c in cfgs]
    try:
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            for failed in ex.map(_mla_precompile, flat):
                for f in failed:
                    print(f"    precompile failed {f}", flush=True)
    except Exception as exc:
        print(f"    parallel precompile skipped: {type(exc).__name__}: {exc}", flush=True)
    print(f"    [precompiled {len(flat)} configs in {time.time()-start:.0f} s]", flush=True)


def bench_sparse_mla(gen):
    batch, ctx, topk = 64, 65536, 2048
    _mla_precompile_all([(h, _mla_cfgs(h)) for h in (8, 64)])
    pages = ctx // 64
    num_rows = batch * ctx
    cache = torch.empty(num_rows, 656, dtype=torch.uint8, device="cuda")
    for s in range(0, num_rows, 1 << 20):  # pack in slices to bound the fp32 temporaries
        cache[s : s + (1 << 20)] = pack_fp8_ds_mla_rows(torch.randn(min(1 << 20, num_rows - s), 576, device="cuda", generator=gen))
    cache = cache.reshape(batch * pages, 64, 656)
    # Each request selects 2048 distinct tokens of its own 64K-token context.
    slots = torch.stack([torch.randperm(ctx, device="cuda", generator=gen)[:topk] + b * ctx for b in range(batch)]).int()
    sm_scale = 576**-0.5
    # History (docs/benchmarks.md): a split-K rewrite with one dequantized [32, 512] tile, a token-major kernel
    # (S^T = K q^T, wgmma at 8 heads) and a lazy rescale (only when a row max grows by 2^8) were all measured
    # and dropped. Every config is checked against the reference on a NaN-poisoned output.
    for heads in (8, 64):
        cfgs = _mla_cfgs(heads)
        q = torch.randn(batch, heads, 576, device="cuda", generator=gen).bfloat16()
        ref, ref_lse = sparse_mla_decode_reference(q, cache, slots, sm_scale)
        out = torch.empty((batch, heads, 512), device="cuda", dtype=torch.bfloat16)
        results = []
        for cfg in cfgs:
            try:
                out.fill_(float("nan"))
                lse = _mla_call(cfg, q, cache, slots, sm_scale, out=out)[1]
                err, lerr = rel_err(out, ref), rel_err(lse, ref_lse)
                ms = measure.graph_median_ms(lambda: _mla_call(cfg, q, cache, slots, sm_scale))
                results.append((ms, cfg, err))
                print(f"    H={heads} config {_mla_name(cfg)}: {ms*1e3:6.1f} us  err {err:.1e} lse {lerr:.1e}", flush=True)
            except Exception as exc:
                print(f"    H={heads} config {cfg}: failed {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
        del ref
        ok = [r for r in results if r[2] < 1e-2]
        if not ok:
            print(f"    H={heads}: no config passed the check", flush=True)
            continue
        base = next((r for r in ok if r[1] == cfgs[0]), None)
        ms, cfg, err = min(ok, key=lambda r: r[0])
        bytes_ = batch * topk * 656 + batch * heads * (576 * 2 + 512 * 2 + 4) + batch * topk * 4
        before = f"; third round's kernel and config in the same run: {base[0]*1e3:.1f} us" if base else ""
        row("sparse_mla_decode (fp8 KV)", f"B={batch} H={heads} K={topk} ctx=64K", ms, bytes_,
            2176 * batch * heads * topk, check=f"err {err:.1e}",
            note=f"{_mla_name(cfg)}{'' if cfg[0] == 'cuda' else ', bf16 partials'}{before}")
        # Diagnostic: the same work with each request's slots sorted (gather locality only changes).
        sorted_slots = slots.sort(dim=1).values
        ms_sorted = measure.graph_median_ms(lambda: _mla_call(cfg, q, cache, sorted_slots, sm_scale))
        print(f"    (same with sorted slots: {ms_sorted*1e3:.1f} us)", flush=True)
        # Diagnostic: half of each list empty (-1), as a short context's top-k is; no row is read for them.
        padded = slots.clone()
        padded[:, 1::2] = -1
        ms_padded = measure.graph_median_ms(lambda: _mla_call(cfg, q, cache, padded, sm_scale))
        print(f"    (same with every other slot -1: {ms_padded*1e3:.1f} us)", flush=True)
        # Diagnostic (CUDA): the same kernel launched plainly, not as a programmatic dependent.
        if cfg[0] == "cuda":
            ms_plain = measure.graph_median_ms(lambda: _mla_call(cfg, q, cache, slots, sm_scale, programmatic=False))
            print(f"    (same launched plainly, not as a programmatic dependent: {ms_plain*1e3:.1f} us)", flush=True)


def bench_hisparse_gather(gen):
    pool_rows, misses = 4 << 20, 131072
    pool = torch.empty(pool_rows, 656, dtype=torch.uint8, pin_memory=True)
    for s in range(0, pool_rows, 1 << 20):  # random bytes, made on the GPU (a CPU fill of 2.7 GB is slow)
        pool[s : s + (1 << 20)].copy_(torch.randint(0, 256, (1 << 20, 656), dtype=torch.uint8, device="cuda", generator=gen))
    hot = torch.full((misses, 656), 0, dtype=torch.uint8, device="cuda")
    src = torch.randperm(pool_rows, device="cuda", generator=gen)[:misses]
    dst = torch.randperm(misses, device="cuda", generator=gen)
    gather_rows(pool, src, hot, dst)
    ok = torch.equal(hot[dst].cpu(), pool[src.cpu()])
    ms_old = measure.graph_median_ms(lambda: gather_rows(pool, src, hot, dst, rows_per_prog=16, num_warps=4))
    print(f"    (first version, 16 rows/program, 4 warps: {ms_old*1e3:.1f} us)")
    cfgs = [(vb, nw) for vb in (1024, 2048, 4096) for nw in (4, 8)]
    ms_unsorted, cfg_r = best(cfgs, lambda c: (lambda: gather_rows(pool, src, hot, dst, num_warps=c[1], vec_block=c[0])))
    print(f"    (flat-vector kernel, random order: {ms_unsorted*1e3:.1f} us = {misses*656/ms_unsorted/1e6:.1f} GB/s)")
    # The copy alone on a list already in host order (what HotBufferLRU.resolve emits): config sweep.
    order = torch.argsort(src)
    src_sorted, dst_sorted = src[order], dst[order]
    print("    copy alone, list presorted by host row:")
    ms_sorted, cfg = best(cfgs + [(8192, 8), (8192, 16)],
                          lambda c: (lambda: gather_rows(pool, src_sorted, hot, dst_sorted, num_warps=c[1], vec_block=c[0])))

    def old_sort():  # the first round's path: int64 torch.sort, then the copy
        s_, o_ = torch.sort(src)
        gather_rows(pool, s_, hot, dst[o_], num_warps=cfg[1], vec_block=cfg[0])

    variants = [("sort int64 (before)", old_sort),
                ("sort int32", lambda: gather_rows(pool, src, hot, dst, num_warps=cfg[1], vec_block=cfg[0], sort_src="sort"))]
    for shift in (8, 10, 12, 14, 16):
        variants.append((f"bucket shift {shift}", (lambda sh: lambda: gather_rows(
            pool, src, hot, dst, num_warps=cfg[1], vec_block=cfg[0], sort_src="bucket", bucket_shift=sh))(shift)))
    print("    end to end (ordering on the device included), each timed twice:")
    e2e = {}
    for name, fn in variants:
        t = [measure.graph_median_ms(fn) for _ in range(2)]
        e2e[name] = min(t)
        print(f"    {name:22s}: {t[0]*1e3:.1f} / {t[1]*1e3:.1f} us = {misses*656/min(t)/1e6:.1f} GB/s "
              f"({misses*656/CEIL['pcie_h2d']/(min(t)*1e-3)*100:.1f}% of H2D)", flush=True)
    s32 = src.int()
    for shift in (10, 12, 14):
        t_b = measure.graph_median_ms(lambda: bucket_by_host_row(s32, dst, pool_rows, shift))
        print(f"    ordering alone, bucket shift {shift}: {t_b*1e3:.1f} us", flush=True)
    t_s32 = measure.graph_median_ms(lambda: torch.sort(s32))
    t_s64 = measure.graph_median_ms(lambda: (lambda r: dst[r[1]])(torch.sort(src)))
    print(f"    ordering alone: torch.sort int32 {t_s32*1e3:.1f} us, int64 sort + dst gather {t_s64*1e3:.1f} us", flush=True)
    best_name = min((k for k in e2e if k.startswith("bucket")), key=e2e.get)
    ms = e2e[best_name]
    shift = int(best_name.split()[-1])
    hot.fill_(0xA5)
    gather_rows(pool, src, hot, dst, num_warps=cfg[1], vec_block=cfg[0], sort_src="bucket", bucket_shift=shift)
    ok = ok and torch.equal(hot[dst].cpu(), pool[src.cpu()])
    hot.fill_(0x5A)
    gather_rows(pool, src, hot, dst, num_warps=cfg[1], vec_block=cfg[0], sort_src="bucket", bucket_shift=shift)
    ok = ok and torch.equal(hot[dst].cpu(), pool[src.cpu()])
    row("hisparse_gather (UVA)", f"{misses} random 656-B rows of 4M pinned", ms, misses * 656, link="PCIe",
        check="bit-exact" if ok else "WRONG", note=f"{best_name} (ordering included), 16-B vectors/prog,warps={cfg}; "
        f"before (int64 sort) {e2e['sort int64 (before)']*1e3:.0f} us; copy alone {ms_sorted*1e3:.0f} us; "
        f"unsorted {ms_unsorted*1e3:.0f} us")
    ROWS.append(dict(kernel="hisparse end to end", times_us={k: v * 1e3 for k, v in e2e.items()},
                     copy_alone_presorted_us=ms_sorted * 1e3, best_cfg=cfg))
    # What limits it: the same kernel on consecutive rows, and the copy engine on the same bytes.
    seq_src = torch.arange(misses, device="cuda")
    ms_seq = measure.graph_median_ms(lambda: gather_rows(pool, seq_src, hot, dst, num_warps=cfg[1], vec_block=cfg[0]))
    near_src = torch.randperm(65536, device="cuda", generator=gen)[: misses // 2]
    ms_near = measure.graph_median_ms(lambda: gather_rows(pool, near_src, hot, dst[: misses // 2], num_warps=cfg[1],
                                                          vec_block=cfg[0]))
    print(f"    same rows sorted by host row: {ms_sorted*1e3:.1f} us = {misses*656/ms_sorted/1e6:.1f} GB/s; "
          f"{misses//2} random rows of the first 65536 (43 MB): {ms_near*1e3:.1f} us = "
          f"{misses//2*656/ms_near/1e6:.1f} GB/s", flush=True)
    ROWS.append(dict(kernel="hisparse locality", sorted_GBps=misses * 656 / ms_sorted / 1e6,
                     random_in_43MB_GBps=misses // 2 * 656 / ms_near / 1e6))
    flat = pool[:misses]
    ms_ce = measure.graph_median_ms(lambda: hot.copy_(flat, non_blocking=True))
    print(f"    SM zero-copy on {misses} consecutive rows: {ms_seq*1e3:.1f} us = {misses*656/ms_seq/1e6:.1f} GB/s; "
          f"copy engine, same {misses*656/1e6:.0f} MB contiguous: {ms_ce*1e3:.1f} us = {misses*656/ms_ce/1e6:.1f} GB/s",
          flush=True)
    ROWS.append(dict(kernel="hisparse diagnostics", sm_consecutive_GBps=misses * 656 / ms_seq / 1e6,
                     copy_engine_contiguous_GBps=misses * 656 / ms_ce / 1e6, first_version_us=ms_old * 1e3))
    try:  # copy engines on the same random rows: one cudaMemcpyBatchAsync of 656-B copies (CUDA >= 12.8)
        from cuda.bindings import runtime as cudart
        import time as _t
        n = 16384
        srcs = [pool.data_ptr() + 656 * int(r) for r in src[:n].cpu()]
        dsts = [hot.data_ptr() + 656 * int(r) for r in dst[:n].cpu()]
        sizes = [656] * n
        attr = cudart.cudaMemcpyAttributes()
        attr.srcAccessOrder = cudart.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        stream = torch.cuda.current_stream().cuda_stream
        def batch():
            res = cudart.cudaMemcpyBatchAsync(dsts, srcs, sizes, n, [attr], [0], 1, stream)
            if res[0] != cudart.cudaError_t.cudaSuccess:
                raise RuntimeError(str(res))
        batch(); torch.cuda.synchronize()
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = _t.perf_counter(); ev0.record(); batch(); ev1.record(); torch.cuda.synchronize(); wall = _t.perf_counter() - t0
        gpu_ms = ev0.elapsed_time(ev1)
        okb = torch.equal(hot[dst[:n]].cpu(), pool[src[:n].cpu()])
        print(f"    cudaMemcpyBatchAsync {n} x 656 B: GPU {gpu_ms*1e3:.0f} us = {n*656/gpu_ms/1e6:.1f} GB/s, "
              f"wall incl. submit {wall*1e6:.0f} us, correct={okb}", flush=True)
        ROWS.append(dict(kernel="hisparse memcpy batch", rows=n, gpu_us=gpu_ms * 1e3, wall_us=wall * 1e6, ok=okb))
    except Exception as exc:
        print(f"    cudaMemcpyBatchAsync: not measured ({type(exc).__name__}: {str(exc)[:200]})", flush=True)


def bench_dcp_overlap():
    """Issue 8: per-layer DCP KV all-gather (656 B/token/layer, half the context per rank) overlapped
    with the previous layer's compute, 2 GPUs, 8 layers; see longctx_kernels/dcp_overlap.py."""
    from longctx_kernels import dcp_overlap

    rows, ok = dcp_overlap.run(layers=8, reps=100, warmup=3, channel_settings=(None, 4, 2))
    print(f"  DCP=2 KV all-gather overlap, 8 layers, compute = {dcp_overlap.GEMMS} bf16 GEMMs "
          f"[{dcp_overlap.CHUNK}x{dcp_overlap.HIDDEN}]x[{dcp_overlap.HIDDEN}x{dcp_overlap.FFN}] per layer, "
          f"{rows[0]['n']} interleaved reps, gathered data {'correct' if ok else 'WRONG'}:")
    print("  | NCCL max CTAs | context | variant | median (ms) | IQR (ms) | overhead (medians) | "
          "overhead (paired, IQR) | per-rank medians (ms) |")
    print("  | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"  | {r['channels'] or 'default'} | {r['context']} | {r['variant']} | {r['median_ms']:.3f} | "
              f"{r['q1_ms']:.3f}-{r['q3_ms']:.3f} | {100*r['overhead']:+.1f}% | {100*r['paired_overhead']:+.1f}% "
              f"({100*r['paired_overhead_iqr'][0]:+.1f}..{100*r['paired_overhead_iqr'][1]:+.1f}) | "
              f"{' / '.join(f'{x:.3f}' for x in r['rank_median_ms'])} |", flush=True)
        ROWS.append(dict(kernel="dcp_kv_allgather overlap", check_ok=ok, **r))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write all rows and ceilings here")
    parser.add_argument("--only", default="", help="comma list of sections: lse,cp,indexer,mla,gather,overlap")
    args = parser.parse_args()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    env = dict(gpus=smi, torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
               cuda=torch.version.cuda)
    print("environment:", env, flush=True)
    bench_ceilings()
    gen = torch.Generator(device="cuda").manual_seed(0)
    sections = [("lse", bench_lse_merge), ("cp", bench_cp_sharding), ("indexer", lambda: bench_indexer(gen)),
                ("mla", lambda: bench_sparse_mla(gen)), ("gather", lambda: bench_hisparse_gather(gen))]
    if torch.cuda.device_count() >= 2:
        sections.append(("overlap", bench_dcp_overlap))
    else:
        print("DCP all-gather overlap: skipped, only 1 GPU visible")
    only = [x for x in args.only.split(",") if x]
    for name, section in sections:
        if only and name not in only:
            continue
        start = time.time()
        try:
            section()
        except Exception:
            traceback.print_exc()
        torch.cuda.empty_cache()
        print(f"  [section took {time.time()-start:.0f} s]", flush=True)
    print("\n| kernel | shape | time (us) | floor (us) | bound | fraction | check | note |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in ROWS:
        if "time_us" in r:
            print(f"| {r['kernel']} | {r['shape']} | {r['time_us']:.1f} | {r['floor_us']:.1f} | {r['bound']} | "
                  f"{r['fraction']*100:.0f}% | {r['check']} | {r['note']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(env=env, ceilings=CEIL, rows=ROWS), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
