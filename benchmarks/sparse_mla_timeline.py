"""Where the many-head sparse-MLA kernel's time goes, on one GPU, at B=64, H=64, K=2048 over a
64K-token context, cold (each call on its own top-k lists, as in kernels_bench.py).

A copy of csrc/sparse_mla_wgmma.cu marks points of each CTA by %globaltimer (ns, one clock for
every SM): its start, q staged, tile 0 landed, the end of its tile loop, the merge's two cluster
barriers, its end; and for each tile, when its consumer began to wait for it and when it had it.
The first thread of each consumer warpgroup also marks the phases of every iteration (two tiles)
by clock64 (its SM's cycles): waiting for its tile, S^T, waiting for the other's P^T, P.V of the
other's tile, the softmax and P^T's store, P.V of its own tile, the loop's turn.

    PYTHONPATH=kernels python3 benchmarks/sparse_mla_timeline.py

Percentiles are over the CTAs of the last of a rotation of calls (cold). The marks cost about
1 us of the kernel's time; the plain kernel's time is printed beside.
"""

from __future__ import annotations

import ctypes
import statistics
import tempfile
from pathlib import Path

import torch
from cuda.bindings import driver

from longctx_kernels import cuda_module, measure
from longctx_kernels.sparse_mla import pack_fp8_ds_mla_rows, sparse_mla_decode_wgmma

SOURCE = "sparse_mla_wgmma.cu"
POINTS = ["start", "q staged", "tile 0 landed", "loop end", "merge barrier 1", "merge barrier 2", "end"]
PHASES = ["wait for its tile", "S^T", "wait for the other's P^T", "P.V, the other's tile", "softmax, P^T stored",
          "P.V, its own tile", "to the next iteration"]
MAX_CTAS, MAX_ITERATIONS = 1024, 32
SPLITS = 2  # a request's slices: clusters of 2 CTAs, as the dispatcher picks at B=64 on an H200
HEADER = (f"__device__ unsigned long long g_points[{MAX_CTAS}][{len(POINTS)}];\n"
          f"__device__ unsigned long long g_tiles[{MAX_CTAS}][2][{MAX_ITERATIONS}][2];\n"
          f"__device__ long long g_phases[{MAX_CTAS}][2][{MAX_ITERATIONS}][{len(PHASES)}];\n"
          "__device__ __forceinline__ unsigned long long ns_now() {\n"
          '  unsigned long long t;\n  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n  return t;\n}\n'
          "#define CTA_INDEX (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))\n"
          "#define POINT(k) if (tid == 0) g_points[CTA_INDEX][k] = ns_now()\n"
          f"#define PHASE(k) if (t == 0 && i / 2 < {MAX_ITERATIONS}) g_phases[CTA_INDEX][role][i / 2][k] = clock64()\n")
LOOP_TOP = "      const int n_tiles = slice_of(K, k_per_split).tiles;\n      if (i > n_tiles) break;\n"
FULL_WAIT = "        mbar_wait(&sh.full[stage], (i / kStages) & 1);\n"
TILE = f"        if (t == 0 && i / 2 < {MAX_ITERATIONS}) g_tiles[CTA_INDEX][role][i / 2][%d] = ns_now();\n"
Q_STAGED = "    bar_sync(kConsumers, 2 * kGroupThreads);\n    const int other"
OTHER_PV = "        pv(o, smem_addr(sh.raw[(i - 1) % kStages]), smem_addr(sh.p[(i - 1) % 3]), role, warp, lane);\n"
OWN_PV = "      pv(o, smem_addr(sh.raw[i % kStages]), smem_addr(sh.p[i % 3]), role, warp, lane);\n"
LOOP_END = "    const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kHeads;"
BARRIER_1 = "    if (kSplits > 1) cluster_sync();  // every CTA's loop done: its ring and q take the exchange\n"
BARRIER_2 = "    if (kSplits > 1) cluster_sync();  // every part in\n"
END = "  }\n}\n\n\nextern"
# anchor -> its replacement: each anchor must occur once in the kernel.
MARKS = {
    # Before the anonymous namespace: the marks' arrays keep their plain names for cuModuleGetGlobal.
    "namespace {\n": HEADER + "namespace {\n",
    "t = tid & 127, warp = t >> 5;\n": "t = tid & 127, warp = t >> 5;\n  POINT(0);\n",
    Q_STAGED: Q_STAGED.replace("\n", "\n    POINT(1);\n"),
    LOOP_TOP: LOOP_TOP + "      PHASE(0);\n",
    FULL_WAIT: TILE % 0 + FULL_WAIT + TILE % 1 + "        PHASE(1);\n        if (i == 0) POINT(2);\n",
    "        scores(d, raw, qd, warp, lane, sc, scale_log2);\n": "        scores(d, raw, qd, warp, lane, sc, scale_log2);\n        PHASE(2);\n",
    "        bar_sync(kReady + other, 2 * kGroupThreads);\n": "        bar_sync(kReady + other, 2 * kGroupThreads);\n        PHASE(3);\n",
    OTHER_PV: OTHER_PV + "        PHASE(4);\n",
    "        bar_arrive(kReady + role, 2 * kGroupThreads);\n": "        bar_arrive(kReady + role, 2 * kGroupThreads);\n        PHASE(5);\n",
    OWN_PV: OWN_PV + "      PHASE(6);\n",
    LOOP_END: "    POINT(3);\n" + LOOP_END,
    BARRIER_1: BARRIER_1 + "    POINT(4);\n",
    BARRIER_2: BARRIER_2 + "    POINT(5);\n",
    END: "    POINT(6);\n" + END,
}


def instrumented(source: str) -> str:
    """The kernel with the marks; raises if an anchor no longer matches it."""
    for anchor, replacement in MARKS.items():
        assert source.count(anchor) == 1, f"timeline anchor {anchor.strip()[:60]!r} is no longer once in {SOURCE}"
        source = source.replace(anchor, replacement)
    return source


def read_global(function, name: str, ctype, count: int) -> list:
    module = cuda_module._check(driver.cuFuncGetModule(function))
    ptr, size = cuda_module._check(driver.cuModuleGetGlobal(module, name.encode()))
    buf = (ctype * count)()
    cuda_module._check(driver.cuMemcpyDtoH(ctypes.addressof(buf), ptr, size))
    return list(buf)


def percentiles(values, ps=(0, 10, 50, 90, 100)) -> str:
    s = sorted(values)
    return " ".join(f"{s[min(len(s) - 1, p * len(s) // 100)]:7.2f}" for p in ps)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, ctx, topk, heads = 64, 65536, 2048, 64
    rows = batch * ctx
    cache = torch.empty(rows, 656, dtype=torch.uint8, device="cuda")
    for s in range(0, rows, 1 << 20):
        cache[s:s + (1 << 20)] = pack_fp8_ds_mla_rows(torch.randn(min(1 << 20, rows - s), 576, device="cuda", generator=gen))
    cache = cache.reshape(rows // 64, 64, 656)
    bytes_ = batch * topk * 656 + batch * heads * (576 * 2 + 512 * 2 + 4) + batch * topk * 4
    sets = [(torch.randn(batch, heads, 576, device="cuda", generator=gen).bfloat16(),
             torch.stack([torch.randperm(ctx, device="cuda", generator=gen)[:topk] + b * ctx for b in range(batch)]).int(),
             torch.empty((batch, heads, 512), device="cuda", dtype=torch.bfloat16), torch.empty((batch, heads), device="cuda"))
            for _ in range(measure.cold_sets_needed(bytes_))]
    calls = [lambda s=s: sparse_mla_decode_wgmma(s[0], cache, s[1], 576**-0.5, num_splits=SPLITS, out=s[2], out_lse=s[3]) for s in sets]
    plain_us = measure.cold_graph_median_ms(calls, bytes_) * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / SOURCE).write_text(instrumented((cuda_module.CSRC / SOURCE).read_text()))
        for header in cuda_module.CSRC.glob("*.cuh"):
            (Path(tmp) / header.name).write_text(header.read_text())
        cuda_module.CSRC = Path(tmp)
        cuda_module.load.cache_clear()
        marked_us = measure.cold_graph_median_ms(calls, bytes_) * 1e3
        for call in calls:  # the last call's marks: its inputs are out of L2
            call()
        torch.cuda.synchronize()
        kernel = cuda_module.load(SOURCE, "sparse_mla_wgmma", 0, (("SPARSE_MLA_SPLITS", SPLITS),), arch_suffix="a")
        ctas = SPLITS * batch
        points = read_global(kernel.function, "g_points", ctypes.c_uint64, MAX_CTAS * len(POINTS))
        tiles = read_global(kernel.function, "g_tiles", ctypes.c_uint64, MAX_CTAS * 2 * MAX_ITERATIONS * 2)
        phases = read_global(kernel.function, "g_phases", ctypes.c_int64, MAX_CTAS * 2 * MAX_ITERATIONS * len(PHASES))
    print(f"B={batch} H={heads} K={topk}, {SPLITS} slices (clusters of {SPLITS} CTAs), cold: {plain_us:.1f} us, {marked_us:.1f} us with the marks")
    at = [[points[c * len(POINTS) + k] for k in range(len(POINTS))] for c in range(ctas)]
    first = min(p[0] for p in at)
    print("per CTA, us (percentiles 0 / 10 / 50 / 90 / 100 over the CTAs):")
    print(f"  {'start, after the first CTA start':38s}{percentiles([(p[0] - first) / 1e3 for p in at])}")
    for k in range(1, len(POINTS)):
        print(f"  {POINTS[k] + ', after ' + POINTS[k - 1]:38s}{percentiles([(p[k] - p[k - 1]) / 1e3 for p in at])}")
    print(f"  {'end, after the first CTA start':38s}{percentiles([(p[-1] - first) / 1e3 for p in at])}")
    n_tiles = topk // SPLITS // 64

    def tile_mark(c, i, k):
        return tiles[((c * 2 + i % 2) * MAX_ITERATIONS + i // 2) * 2 + k]

    print("per tile, median over the CTAs, us: " + " | ".join(
        f"{i}: in at {statistics.median((tile_mark(c, i, 1) - at[c][0]) / 1e3 for c in range(ctas)):.1f}, "
        f"waited {statistics.median((tile_mark(c, i, 1) - tile_mark(c, i, 0)) / 1e3 for c in range(ctas)):.2f}"
        for i in range(n_tiles)))
    print("an iteration of each consumer warpgroup (two tiles), cycles (median / 90th percentile over CTAs and the "
          "iterations but the first and last):")
    for role in range(2):
        def phase(c, it, k):
            return phases[((c * 2 + role) * MAX_ITERATIONS + it) * len(PHASES) + k]
        spans = {name: [] for name in PHASES}
        for c in range(ctas):
            for it in range(1, n_tiles // 2 - 1):
                for k in range(len(PHASES) - 1):
                    spans[PHASES[k]].append(phase(c, it, k + 1) - phase(c, it, k))
                spans[PHASES[-1]].append(phase(c, it + 1, 0) - phase(c, it, len(PHASES) - 1))
        total = sum(statistics.median(v) for v in spans.values())
        print(f"  warpgroup {role}: " + "; ".join(f"{name} {statistics.median(v):.0f} / {sorted(v)[9 * len(v) // 10]:.0f}"
                                                  for name, v in spans.items()) + f"; sum of medians {total:.0f}")


if __name__ == "__main__":
    main()
