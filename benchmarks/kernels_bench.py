"""Kernel benchmark on one H200 (plus the DCP KV all-gather overlap on 2 GPUs when present).

For every kernel: correctness against its PyTorch reference at the full shape on a NaN-poisoned
output, then two times from CUDA-graph replays (host launch cost excluded, as in a graphed
decode step):

- warm: the same call repeated on the same inputs, so whatever fits stays in L2;
- cold: the graph rotates through distinct input sets (at least 4, and together more than twice
  the L2), as a decode step does where every layer reads its own cache.

Only the cold time is set against the floor: the shape's bytes (each input read once, each
output written once) over the HBM or PCIe bandwidth measured in this run, or its FLOPs over the
bf16 matmul rate measured in this run, whichever is larger.

    PYTHONPATH=kernels python3 benchmarks/kernels_bench.py [--only lse,cp,indexer,mla,gather,overlap] [--json out.json]
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
from typing import Callable

import torch
import triton

from longctx_kernels import measure
from longctx_kernels.measure import exact_topk, relative_error as rel_err
from longctx_kernels.cp_sharding import dcp_local_positions, dcp_local_positions_reference, pcp_shard, pcp_shard_reference, pcp_unshard
from longctx_kernels.hisparse import gather_rows
from longctx_kernels.indexer import FP8, indexer_logits, indexer_logits_reference, radix_topk, radix_topk_cuda
from longctx_kernels.lse_merge import lse_merge, lse_merge_reference
from longctx_kernels.sparse_mla import random_fp8_ds_mla_cache, sparse_mla_decode, sparse_mla_decode_reference
from longctx_kernels.sparse_mla_cuda import sparse_mla_decode_cuda, sparse_mla_decode_wgmma

ROWS: list[dict] = []
CEIL: dict[str, float] = {}


def warm_cold(make_call: Callable[[int], Callable[[], object]], bytes_per_set: int) -> tuple[float, float]:
    """(warm ms, cold ms) of the call that make_call(i) builds over its i-th input set."""
    calls = [make_call(i) for i in range(measure.cold_sets_needed(bytes_per_set))]
    return measure.graph_median_ms(calls[0]), measure.cold_graph_median_ms(calls, bytes_per_set)


def row(kernel, shape, warm_ms, cold_ms, bytes_=0.0, flops=0.0, link="HBM", check="", note=""):
    bw = CEIL["pcie_h2d"] if link == "PCIe" else CEIL["hbm"]
    t_bytes = bytes_ / bw * 1e6
    t_flops = flops / CEIL["bf16"] * 1e6
    floor = max(t_bytes, t_flops)
    bound = link if t_bytes >= t_flops else "bf16 MMA"
    r = dict(kernel=kernel, shape=shape, warm_us=warm_ms * 1e3, cold_us=cold_ms * 1e3, floor_us=floor, bound=bound,
             cold_over_floor=cold_ms * 1e3 / floor, check=check, note=note)
    ROWS.append(r)
    print(f"  {kernel:30s} {shape:34s} warm {warm_ms*1e3:8.1f} us  cold {cold_ms*1e3:8.1f} us  floor {floor:7.1f} us "
          f"({bound}) {r['cold_over_floor']:5.2f}x  {check}  {note}", flush=True)
    return r


def bench_ceilings():
    CEIL["hbm"] = measure.hbm_copy_bandwidth(4 << 30)
    CEIL["pcie_h2d"] = measure.pinned_copy_bandwidth(2 << 30, to_device=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    CEIL["bf16"] = 2 * 8192**3 / (measure.median_ms(lambda: a @ b) * 1e-3)
    del a, b
    one = torch.empty(1, device="cuda")
    CEIL["graph_node_us"] = 1e3 * measure.graph_median_ms(lambda: one.fill_(1.0))
    CEIL["l2_mb"] = measure.l2_bytes() / 1e6
    print(f"ceilings: HBM copy {CEIL['hbm']/1e12:.2f} TB/s, pinned H2D {CEIL['pcie_h2d']/1e9:.1f} GB/s, "
          f"bf16 matmul {CEIL['bf16']/1e12:.0f} TFLOP/s, L2 {CEIL['l2_mb']:.0f} MB, "
          f"1-element kernel in a CUDA graph {CEIL['graph_node_us']:.1f} us", flush=True)


def bench_lse_merge():
    for n, b, h in [(8, 64, 8), (2, 64, 64), (8, 8, 8)]:
        d = 512
        bytes_ = n * b * h * (2 * d + 4) + b * h * (2 * d + 4)

        def make(i):
            part = torch.randn(n, b, h, d, device="cuda").bfloat16()
            lse = torch.randn(n, b, h, device="cuda") * 3
            lse[0, :, 0] = -math.inf
            out = torch.full((b, h, d), float("nan"), device="cuda", dtype=torch.bfloat16)
            if i == 0:
                lse_merge(part, lse, out=out)
                make.err = rel_err(out, lse_merge_reference(part, lse)[0])
            return lambda: lse_merge(part, lse, out=out)

        warm, cold = warm_cold(make, bytes_)
        row("lse_merge (DCP combine)", f"N={n} B={b} H={h} D={d} bf16", warm, cold, bytes_, 4 * n * b * h * d,
            check=f"err {make.err:.1e}", note=f"1-elt kernel in a graph {CEIL['graph_node_us']:.1f} us")


def bench_cp_sharding():
    t, n = 131072, 8
    x = torch.randn(t, 576, device="cuda").bfloat16()
    ok = torch.equal(pcp_shard(x, n), pcp_shard_reference(x, n)) and torch.equal(pcp_unshard(pcp_shard(x, n), t), x)
    del x
    xs = [torch.randn(t, 576, device="cuda").bfloat16() for _ in range(measure.cold_sets_needed(4 * t * 576))]
    warm, cold = warm_cold(lambda i: (lambda: pcp_shard(xs[i], n)), 4 * t * 576)
    row("pcp_shard", f"T={t} N={n} row 1152 B", warm, cold, 4 * t * 576, check="exact" if ok else "WRONG")
    shards = [pcp_shard(x, n) for x in xs]
    warm, cold = warm_cold(lambda i: (lambda: pcp_unshard(shards[i], t)), 4 * t * 576)
    row("pcp_unshard", f"T={t} N={n} row 1152 B", warm, cold, 4 * t * 576, check="exact" if ok else "WRONG")
    del xs, shards
    ids = torch.randint(0, 65536, (64, 2048), device="cuda", dtype=torch.int32)
    ok = torch.equal(dcp_local_positions(ids, 3, 8), dcp_local_positions_reference(ids, 3, 8))
    idss = [torch.randint(0, 65536, (64, 2048), device="cuda", dtype=torch.int32)
            for _ in range(measure.cold_sets_needed(8 * ids.numel()))]
    warm, cold = warm_cold(lambda i: (lambda: dcp_local_positions(idss[i], 3, 8)), 8 * ids.numel())
    row("dcp_local_positions", "B=64 K=2048 N=8", warm, cold, 8 * ids.numel(), check="exact" if ok else "WRONG")


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


# The indexer's config (pages/program, warps, stages, unrolled page loop) and the top-k's
# (row batch, list capacity): the best of the sweeps recorded in docs/benchmarks.md.
INDEXER_CFG = (16, 4, 2, False)
TOPK_CFG = (4, 4096)


def bench_indexer(gen):
    batch, seq_len, heads, topk = 64, 65536, 64, 2048
    p, nw, st, un = INDEXER_CFG
    key_bytes = batch * seq_len * 132
    io_bytes = batch * heads * (128 + 4) + 4 * batch * seq_len
    sets = [make_indexer_inputs(batch, seq_len, heads, gen) for _ in range(measure.cold_sets_needed(key_bytes))]
    q, w, k, ks, table, lens = sets[0]
    logits_of = [torch.full((batch, seq_len), float("nan"), device="cuda") for _ in sets]

    def logits_call(i):
        q, w, k, ks, table, lens = sets[i]
        return lambda: indexer_logits(q, w, k, ks, table, lens, seq_len, p, nw, num_stages=st, unroll=un,
                                      out=logits_of[i])

    logits_call(0)()
    err = rel_err(logits_of[0], indexer_logits_reference(q, w, k, ks, table, lens, seq_len))
    warm, cold = warm_cold(logits_call, key_bytes + io_bytes)
    row("indexer_logits (fp8)", f"B={batch} L=64K H_I={heads}", warm, cold, key_bytes + io_bytes,
        2 * batch * heads * 128 * seq_len, check=f"err {err:.1e}",
        note=f"pages/prog,warps,stages,unrolled={INDEXER_CFG}; FLOP floor at the bf16 rate (fp8 is 2x)")
    for i in range(1, len(sets)):
        logits_call(i)()

    # Top-k on each set's logits (16.8 MB a set: warm, they sit in L2).
    rb, cap = TOPK_CFG
    topk_bytes = 4 * batch * seq_len + 4 * batch * topk
    n_topk = measure.cold_sets_needed(topk_bytes)
    logits_sets = logits_of + [torch.randn(batch, seq_len, device="cuda", generator=gen)
                               for _ in range(n_topk - len(logits_of))]
    outs = [torch.full((batch, topk), -7, dtype=torch.int32, device="cuda") for _ in logits_sets]
    radix_topk_cuda(logits_sets[0], lens, topk, out=outs[0], row_batch=rb, list_cap=cap)
    ok = exact_topk(logits_sets[0], outs[0])
    warm, cold = warm_cold(lambda i: (lambda: radix_topk_cuda(logits_sets[i], lens, topk, out=outs[i], row_batch=rb,
                                                              list_cap=cap)), topk_bytes)
    row("radix_topk 2048 (CUDA)", f"B={batch} L=64K", warm, cold, topk_bytes, check="exact set" if ok else "WRONG",
        note=f"csrc/radix_topk.cu, row batch {rb}, lists of {cap}")
    ok_t = exact_topk(logits_sets[0], radix_topk(logits_sets[0], lens, topk, 4096, 8, chunk=4096))
    warm, cold = warm_cold(lambda i: (lambda: radix_topk(logits_sets[i], lens, topk, 4096, 8, chunk=4096)), topk_bytes)
    row("radix_topk 2048 (Triton)", f"B={batch} L=64K", warm, cold, topk_bytes, check="exact set" if ok_t else "WRONG",
        note="(request, 4096-logit chunk) programs, 4 histogram launches + 1 collect")
    warm, cold = warm_cold(lambda i: (lambda: torch.topk(logits_sets[i], topk, dim=1)), topk_bytes + 4 * batch * topk)
    row("torch.topk 2048 (reference point)", f"B={batch} L=64K", warm, cold, topk_bytes + 4 * batch * topk,
        note="values + int64 ids, sorted")
    del logits_sets, outs

    def both_call(i):
        q, w, k, ks, table, lens = sets[i]
        out = torch.empty((batch, topk), dtype=torch.int32, device="cuda")
        return lambda: radix_topk_cuda(indexer_logits(q, w, k, ks, table, lens, seq_len, p, nw, num_stages=st,
                                                      unroll=un, out=logits_of[i]), lens, topk, out=out,
                                       row_batch=rb, list_cap=cap)

    warm, cold = warm_cold(both_call, key_bytes + io_bytes)
    row("indexer logits + top-k", f"B={batch} L=64K H_I={heads} K={topk}", warm, cold,
        key_bytes + io_bytes + 4 * batch * seq_len, note="Triton logits + CUDA top-k")
    del sets, logits_of

    # A 1M-token context: 268 MB of logits a set.
    long_len = 1 << 20
    long_bytes = 4 * batch * long_len + 4 * batch * topk
    long_sets = [torch.randn(batch, long_len, device="cuda", generator=gen)
                 for _ in range(measure.cold_sets_needed(long_bytes))]
    long_lens = torch.full((batch,), long_len, device="cuda", dtype=torch.int32)
    ok = exact_topk(long_sets[0], radix_topk_cuda(long_sets[0], long_lens, topk))
    warm, cold = warm_cold(lambda i: (lambda: radix_topk_cuda(long_sets[i], long_lens, topk)), long_bytes)
    row("radix_topk 2048 (CUDA)", f"B={batch} L=1M (random logits)", warm, cold, long_bytes,
        check="exact set" if ok else "WRONG")
    for b_small in (1, 4):  # distinct sets: the b_small-row slices of the long sets
        def slice_call(i, b_small=b_small):
            rows = long_sets[i % len(long_sets)][b_small * (i // len(long_sets)):][:b_small]
            return lambda: radix_topk_cuda(rows, long_lens[:b_small], topk)

        ok = exact_topk(long_sets[0][:b_small], radix_topk_cuda(long_sets[0][:b_small], long_lens[:b_small], topk))
        warm, cold = warm_cold(slice_call, 4 * b_small * long_len)
        row("radix_topk 2048 (CUDA)", f"B={b_small} L=1M", warm, cold, 4 * b_small * (long_len + topk),
            check="exact set" if ok else "WRONG", note="CTAs a row listing candidates")


# Sparse-MLA candidates by head count: (name, call). The CUDA kernels are the shipped paths;
# Triton's best configs (docs/benchmarks.md) are the reference they must beat.
def _mla_candidates(heads):
    if heads <= 16:
        few = [("CUDA (csrc/sparse_mla_decode.cu" + (", wgmma)" if heads > 8 else ")"),
                lambda q, c, s, sc, o, l: sparse_mla_decode_cuda(q, c, s, sc, out=o, out_lse=l))]
        if heads > 8:  # the same kernel on mma.sync, for comparison
            few.append(("CUDA mma.sync", lambda q, c, s, sc, o, l: sparse_mla_decode_cuda(q, c, s, sc, out=o, out_lse=l,
                                                                                        wgmma=False)))
        return few + [("Triton, block_h 16, 4 splits, fp16 MMA", lambda q, c, s, sc, o, l: sparse_mla_decode(
                    q, c, s, sc, num_splits=4, block_h=16, num_warps=4, num_stages=2, block_k=16,
                    partial_dtype=torch.bfloat16, prefetch=True, fp16_mma=True, out=o, out_lse=l))]
    return [("CUDA wgmma (csrc/sparse_mla_wgmma.cu)",
             lambda q, c, s, sc, o, l: sparse_mla_decode_wgmma(q, c, s, sc, out=o, out_lse=l)),
            ("Triton, block_h 64, 2 splits, bf16 MMA", lambda q, c, s, sc, o, l: sparse_mla_decode(
                q, c, s, sc, num_splits=2, block_h=64, num_warps=8, num_stages=3, block_k=64,
                partial_dtype=torch.bfloat16, out=o, out_lse=l))]


def bench_sparse_mla(gen):
    batch, ctx, topk = 64, 65536, 2048
    cache = random_fp8_ds_mla_cache(batch * ctx, gen)
    sm_scale = 576**-0.5
    # Each request selects 2048 distinct tokens of its own 64K-token context; every set its own.
    def random_slots():
        return torch.stack([torch.randperm(ctx, device="cuda", generator=gen)[:topk] + b * ctx for b in range(batch)]).int()

    for heads in (8, 16, 64):
        bytes_ = batch * topk * 656 + batch * heads * (576 * 2 + 512 * 2 + 4) + batch * topk * 4
        n_sets = measure.cold_sets_needed(bytes_)
        sets = [(torch.randn(batch, heads, 576, device="cuda", generator=gen).bfloat16(), random_slots(),
                 torch.empty((batch, heads, 512), device="cuda", dtype=torch.bfloat16),
                 torch.empty((batch, heads), device="cuda")) for _ in range(n_sets)]
        q, slots, out, lse = sets[0]
        ref, ref_lse = sparse_mla_decode_reference(q, cache, slots, sm_scale)
        results = []
        for name, call in _mla_candidates(heads):
            try:
                out.fill_(float("nan"))
                lse.fill_(float("nan"))
                call(q, cache, slots, sm_scale, out, lse)
                err, lerr = rel_err(out, ref), rel_err(lse, ref_lse)
                warm, cold = warm_cold(lambda i: (lambda s=sets[i]: call(s[0], cache, s[1], sm_scale, s[2], s[3])), bytes_)
                results.append((cold, warm, name, call, err, lerr))
                print(f"    H={heads} {name}: warm {warm*1e3:6.1f} us  cold {cold*1e3:6.1f} us  err {err:.1e} "
                      f"lse {lerr:.1e}", flush=True)
            except Exception as exc:
                print(f"    H={heads} {name}: failed {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
        del ref
        ok = [r for r in results if r[4] < 1e-2 and r[5] < 1e-4]
        if not ok:
            print(f"    H={heads}: no candidate passed the check", flush=True)
            continue
        cold, warm, name, call, err, lerr = min(ok, key=lambda r: r[0])
        flushed = measure.flushed_graph_median_ms(lambda: call(q, cache, slots, sm_scale, out, lse))
        others = "; ".join(f"{r[2]}: cold {r[0]*1e3:.1f} us" for r in results if r[2] != name)
        row("sparse_mla_decode (fp8 KV)", f"B={batch} H={heads} K={topk} ctx=64K", warm, cold, bytes_,
            2176 * batch * heads * topk, check=f"err {err:.1e}, lse {lerr:.1e}",
            note=f"{name}; after an L2 flush {flushed*1e3:.1f} us; {others}")
        # Half of each list empty (-1), as a short context's top-k is: no row is read for them.
        padded = [(s[0], s[1].clone(), s[2], s[3]) for s in sets]
        for s in padded:
            s[1][:, 1::2] = -1
        _, cold_padded = warm_cold(lambda i: (lambda s=padded[i]: call(s[0], cache, s[1], sm_scale, s[2], s[3])), bytes_)
        print(f"    (same, every other slot -1: cold {cold_padded*1e3:.1f} us)", flush=True)
        del sets, padded


def bench_hisparse_gather(gen):
    pool_rows, misses = 4 << 20, 131072
    pool = torch.empty(pool_rows, 656, dtype=torch.uint8, pin_memory=True)
    for s in range(0, pool_rows, 1 << 20):  # random bytes, made on the GPU (a CPU fill of 2.7 GB is slow)
        pool[s : s + (1 << 20)].copy_(torch.randint(0, 256, (1 << 20, 656), dtype=torch.uint8, device="cuda", generator=gen))
    bytes_ = misses * 656
    sets = [(torch.randperm(pool_rows, device="cuda", generator=gen)[:misses], torch.randperm(misses, device="cuda", generator=gen),
             torch.zeros((misses, 656), dtype=torch.uint8, device="cuda")) for _ in range(measure.cold_sets_needed(bytes_))]
    src, dst, hot = sets[0]
    ok = True
    for fill in (0xA5, 0x5A):  # two poisons: a row the kernel skipped fails one of them
        hot.fill_(fill)
        gather_rows(pool, src, hot, dst, num_warps=8, vec_block=4096, sort_src="bucket")
        ok = ok and torch.equal(hot[dst].cpu(), pool[src.cpu()])
    warm, cold = warm_cold(lambda i: (lambda s=sets[i]: gather_rows(pool, s[0], s[2], s[1], num_warps=8, vec_block=4096,
                                                                    sort_src="bucket")), bytes_)
    row("hisparse_gather (UVA)", f"{misses} random 656-B rows of 4M pinned", warm, cold, bytes_, link="PCIe",
        check="bit-exact" if ok else "WRONG", note="bucket shift 10 (ordering included), 4096 16-B vectors/prog, 8 warps")


def bench_dcp_overlap():
    """Per-layer DCP KV all-gather (656 B/token/layer, half the context per rank) overlapped with the
    previous layer's compute, 2 GPUs, 8 layers; see longctx_kernels/dcp_overlap.py."""
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
    print("\n| kernel | shape | warm (µs) | cold (µs) | floor (µs) | bound | cold / floor | check | note |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in ROWS:
        if "cold_us" in r:
            print(f"| {r['kernel']} | {r['shape']} | {r['warm_us']:.1f} | {r['cold_us']:.1f} | {r['floor_us']:.1f} | "
                  f"{r['bound']} | {r['cold_over_floor']:.2f}x | {r['check']} | {r['note']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(env=env, ceilings=CEIL, rows=ROWS), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
