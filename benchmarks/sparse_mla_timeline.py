"""Where a sparse-MLA kernel's time goes, on one GPU, at B=64, K=2048 over a 64K-token context,
cold (each call on its own top-k lists, as in kernels_bench.py): the many-head kernel at H=64
(csrc/sparse_mla_wgmma.cu) or the few-head one on wgmma at H=16 (csrc/sparse_mla_decode.cu).

A copy of the kernel marks points of each CTA by %globaltimer (ns, one clock for every SM): its
start, q staged, tile 0 landed, the end of its tile loop, the merge's steps, its end; and for each
tile, when its consumer began to wait for it and when it had it. The first thread of each
consumer warpgroup also marks the phases of every iteration by clock64 (its SM's cycles).

    PYTHONPATH=kernels python3 benchmarks/sparse_mla_timeline.py [--heads 64|16]

Percentiles are over the CTAs of the last of a rotation of calls (cold). The marks cost 1 us
(H=16) to 6 us (H=64) of the kernel's time; the plain kernel's time is printed beside.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from cuda.bindings import driver

from longctx_kernels import cuda_module, measure
from longctx_kernels.sparse_mla import random_fp8_ds_mla_cache
from longctx_kernels.sparse_mla_cuda import sparse_mla_decode_cuda, sparse_mla_decode_wgmma

MAX_CTAS, MAX_ITERATIONS = 1024, 32
SPLITS = 2  # a request's slices: clusters of 2 CTAs, as the dispatchers pick at B=64 on an H200


@dataclass(frozen=True)
class Layout:
    source: str
    defines: tuple[tuple[str, int], ...]  # the launcher's at B=64 (the test compiles the marked copy with them)
    points: list[str]
    phases: list[str]
    iteration: str  # what one iteration of a consumer warpgroup covers
    lead: str  # the thread that marks its warpgroup's tiles and phases
    role: str  # its warpgroup, 0 or 1
    marks: dict[str, str]  # anchor -> its replacement: each anchor must occur once in the kernel

    def header(self) -> str:
        """The marks' arrays (per CTA its points; per CTA, warpgroup and iteration its tile's wait
        and arrival in ns and its phases in cycles) and macros."""
        return (f"__device__ unsigned long long g_points[{MAX_CTAS}][{len(self.points)}];\n"
                f"__device__ unsigned long long g_tiles[{MAX_CTAS}][2][{MAX_ITERATIONS}][2];\n"
                f"__device__ long long g_phases[{MAX_CTAS}][2][{MAX_ITERATIONS}][{len(self.phases)}];\n"
                "__device__ __forceinline__ unsigned long long ns_now() {\n"
                '  unsigned long long t;\n  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n  return t;\n}\n'
                "#define CTA_INDEX (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))\n"
                "#define POINT(k) if (threadIdx.x == 0) g_points[CTA_INDEX][k] = ns_now()\n"
                "#define LAST_TEAM_POINT(k) if (threadIdx.x == 128 * (kTeams - 1)) g_points[CTA_INDEX][k] = ns_now()\n"
                f"#define PHASE(k) if ({self.lead} && i / 2 < {MAX_ITERATIONS}) g_phases[CTA_INDEX][{self.role}][i / 2][k] = clock64()\n"
                f"#define TILE(k) if ({self.lead} && i / 2 < {MAX_ITERATIONS}) g_tiles[CTA_INDEX][{self.role}][i / 2][k] = ns_now()\n")


def mark(anchor: str, before: str = "", after: str = "") -> tuple[str, str]:
    return anchor, before + anchor + after


MANY = Layout(  # two consumer warpgroups, an iteration of each two tiles (its own and the other's)
    "sparse_mla_wgmma.cu", (("SPARSE_MLA_SPLITS", SPLITS),),
    ["start", "q staged", "tile 0 landed", "loop end", "merge barrier 1", "merge barrier 2", "end"],
    ["wait for its tile", "S^T", "wait for the other's P^T", "P.V, the other's tile", "softmax, P^T stored",
     "P.V, its own tile", "to the next iteration"],
    "two tiles", "t == 0", "role",
    dict([
        mark("t = tid & 127, warp = t >> 5;\n", after="  POINT(0);\n"),
        ("    bar_sync(kConsumers, 2 * kGroupThreads);\n    const int other",
         "    bar_sync(kConsumers, 2 * kGroupThreads);\n    POINT(1);\n    const int other"),
        mark("      const int n_tiles = slice_of(K, k_per_split).tiles;\n      if (i > n_tiles) break;\n",
             after="      PHASE(0);\n"),
        mark("        mbar_wait(&sh.full[stage], (i / kStages) & 1);\n", before="        TILE(0);\n",
             after="        TILE(1);\n        PHASE(1);\n        if (i == 0) POINT(2);\n"),
        mark("        scores(d, raw, qd, warp, lane, sc, scale_log2);\n", after="        PHASE(2);\n"),
        mark("        bar_sync(kReady + other, 2 * kGroupThreads);\n", after="        PHASE(3);\n"),
        mark("        pv(o, smem_addr(sh.raw[(i - 1) % kStages]), smem_addr(sh.p[(i - 1) % 3]), role, warp, lane);\n",
             after="        PHASE(4);\n"),
        mark("        bar_arrive(kReady + role, 2 * kGroupThreads);\n", after="        PHASE(5);\n"),
        mark("      pv(o, smem_addr(sh.raw[i % kStages]), smem_addr(sh.p[i % 3]), role, warp, lane);\n",
             after="      PHASE(6);\n"),
        mark("    const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kHeads;", before="    POINT(3);\n"),
        mark("    if (kSplits > 1) cluster_sync();  // every CTA's loop done: its ring and q take the exchange\n",
             after="    POINT(4);\n"),
        mark("    if (kSplits > 1) cluster_sync();  // every part in\n", after="    POINT(5);\n"),
        mark("  }\n}\n\n\nextern", before="    POINT(6);\n"),
    ]))

FEW = Layout(  # 16 heads on wgmma: two teams (warpgroups) taking the tiles in turn, an iteration of each one tile
    "sparse_mla_decode.cu",
    (("SPARSE_MLA_TILE", 64), ("SPARSE_MLA_STAGES", 3), ("SPARSE_MLA_HEAD_TILES", 2), ("SPARSE_MLA_CTAS_PER_SM", 1),
     ("SPARSE_MLA_PRODUCERS", 4), ("SPARSE_MLA_SPLITS", SPLITS), ("SPARSE_MLA_TEAMS", 2), ("SPARSE_MLA_WGMMA", 1)),
    ["start", "q staged", "tile 0 landed", "the last team's loop end", "every CTA's groups in", "end"],
    ["wait for its tile", "S", "tile maximum exchanged", "softmax, P stored", "P.V", "to the next tile"],
    "one tile", "j == 0 && lane == 0", "team",
    dict([
        mark("  const int split = blockIdx.x, b = blockIdx.y;\n", after="  POINT(0);\n"),
        mark('  asm volatile("bar.sync 15, %0;\\n" ::"n"(32 * kConsumers) : "memory");  // q is staged\n',
             after="  POINT(1);\n"),
        mark("    const unsigned char* rows = landed(sh, i);\n    const unsigned char* row0", before="    PHASE(0);\n    TILE(0);\n"),
        mark("  // this thread's tokens for S\n    const unsigned char* row1 = row0 + 8 * kRowBytes;\n", after="    TILE(1);\n    PHASE(1);\n    if (i == 0) POINT(2);\n"),
        mark("    pin(racc);\n", after="    PHASE(2);\n"),
        ("    team_sync(team);\n    float alpha[4], tile_ref", "    team_sync(team);\n    PHASE(3);\n    float alpha[4], tile_ref"),
        mark("    team_sync(team);  // every P tile is written\n", after="    PHASE(4);\n"),
        ("    for (int p = 0; p < 4; ++p) { pin(o[p][0]); pin(o[p][1]); }\n  }\n",
         "    for (int p = 0; p < 4; ++p) { pin(o[p][0]); pin(o[p][1]); }\n    PHASE(5);\n  }\n  LAST_TEAM_POINT(3);\n"),
        mark("  cluster_sync();  // every CTA's groups are in\n", after="  LAST_TEAM_POINT(4);\n"),
        ("    }\n  }\n}\n#endif\n\n}  // namespace", "    }\n  }\n  LAST_TEAM_POINT(5);\n}\n#endif\n\n}  // namespace"),
    ]))
LAYOUTS = {64: MANY, 16: FEW}


def instrumented(layout: Layout, source: str) -> str:
    """The kernel with the marks; raises if an anchor no longer matches it."""
    # Before the anonymous namespace: the marks' arrays keep their plain names for cuModuleGetGlobal.
    for anchor, replacement in [("namespace {\n", layout.header() + "namespace {\n"), *layout.marks.items()]:
        assert source.count(anchor) == 1, f"timeline anchor {anchor.strip()[:60]!r} is no longer once in {layout.source}"
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", type=int, choices=sorted(LAYOUTS), default=64)
    heads = parser.parse_args().heads
    layout = LAYOUTS[heads]
    decode = sparse_mla_decode_wgmma if layout is MANY else sparse_mla_decode_cuda
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, ctx, topk = 64, 65536, 2048
    cache = random_fp8_ds_mla_cache(batch * ctx, gen)
    bytes_ = batch * topk * 656 + batch * heads * (576 * 2 + 512 * 2 + 4) + batch * topk * 4
    sets = [(torch.randn(batch, heads, 576, device="cuda", generator=gen).bfloat16(),
             torch.stack([torch.randperm(ctx, device="cuda", generator=gen)[:topk] + b * ctx for b in range(batch)]).int(),
             torch.empty((batch, heads, 512), device="cuda", dtype=torch.bfloat16), torch.empty((batch, heads), device="cuda"))
            for _ in range(measure.cold_sets_needed(bytes_))]
    calls = [lambda s=s: decode(s[0], cache, s[1], 576**-0.5, num_splits=SPLITS, out=s[2], out_lse=s[3]) for s in sets]
    plain_us = measure.cold_graph_median_ms(calls, bytes_) * 1e3
    points_n, phases_n = len(layout.points), len(layout.phases)
    loaded = []  # the marked kernel, as the launcher loads it
    load = cuda_module.load

    def load_and_keep(*args, **kwargs):
        loaded.append(load(*args, **kwargs))
        return loaded[-1]

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / layout.source).write_text(instrumented(layout, (cuda_module.CSRC / layout.source).read_text()))
        for header in cuda_module.CSRC.glob("*.cuh"):
            (Path(tmp) / header.name).write_text(header.read_text())
        cuda_module.CSRC = Path(tmp)
        load.cache_clear()
        cuda_module.load = load_and_keep
        marked_us = measure.cold_graph_median_ms(calls, bytes_) * 1e3
        for call in calls[:-1]:  # the other sets' rows evict the last set's from L2
            call()
        torch.cuda.synchronize()  # and the last call runs alone: none of its CTAs starts during another call
        calls[-1]()
        torch.cuda.synchronize()
        kernel = loaded[-1]
        ctas = SPLITS * batch
        points = read_global(kernel.function, "g_points", ctypes.c_uint64, MAX_CTAS * points_n)
        tiles = read_global(kernel.function, "g_tiles", ctypes.c_uint64, MAX_CTAS * 2 * MAX_ITERATIONS * 2)
        phases = read_global(kernel.function, "g_phases", ctypes.c_int64, MAX_CTAS * 2 * MAX_ITERATIONS * phases_n)
    print(f"B={batch} H={heads} K={topk}, {SPLITS} slices (clusters of {SPLITS} CTAs), cold: {plain_us:.1f} us, "
          f"{marked_us:.1f} us with the marks")
    at = [[points[c * points_n + k] for k in range(points_n)] for c in range(ctas)]
    first = min(p[0] for p in at)
    print("per CTA, us (percentiles 0 / 10 / 50 / 90 / 100 over the CTAs):")
    print(f"  {'start, after the first CTA start':48s}{percentiles([(p[0] - first) / 1e3 for p in at])}")
    for k in range(1, points_n):
        print(f"  {layout.points[k] + ', after ' + layout.points[k - 1]:48s}{percentiles([(p[k] - p[k - 1]) / 1e3 for p in at])}")
    print(f"  {'end, after the first CTA start':48s}{percentiles([(p[-1] - first) / 1e3 for p in at])}")
    n_tiles = topk // SPLITS // 64

    def tile_mark(c, i, k):
        return tiles[((c * 2 + i % 2) * MAX_ITERATIONS + i // 2) * 2 + k]

    print("per tile, median over the CTAs, us: " + " | ".join(
        f"{i}: in at {statistics.median((tile_mark(c, i, 1) - at[c][0]) / 1e3 for c in range(ctas)):.1f}, "
        f"waited {statistics.median((tile_mark(c, i, 1) - tile_mark(c, i, 0)) / 1e3 for c in range(ctas)):.2f}"
        for i in range(n_tiles)))
    print(f"an iteration of each consumer warpgroup ({layout.iteration}), cycles (median / 90th percentile over CTAs "
          "and the iterations but the first and last):")
    for role in range(2):
        def phase(c, it, k):
            return phases[((c * 2 + role) * MAX_ITERATIONS + it) * phases_n + k]
        spans = {name: [] for name in layout.phases}
        for c in range(ctas):
            for it in range(1, n_tiles // 2 - 1):
                for k in range(phases_n - 1):
                    spans[layout.phases[k]].append(phase(c, it, k + 1) - phase(c, it, k))
                spans[layout.phases[-1]].append(phase(c, it + 1, 0) - phase(c, it, phases_n - 1))
        total = sum(statistics.median(v) for v in spans.values())
        print(f"  warpgroup {role}: " + "; ".join(f"{name} {statistics.median(v):.0f} / {sorted(v)[9 * len(v) // 10]:.0f}"
                                                  for name, v in spans.items()) + f"; sum of medians {total:.0f}")


if __name__ == "__main__":
    main()
