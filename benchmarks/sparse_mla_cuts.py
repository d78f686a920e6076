"""Where the CUDA sparse-MLA kernel's time goes, on one GPU, at B=64, K=2048 over a 64K-token
context. At H=8 (mma.sync): whole and with parts cut out of its source (P.V; then S's MMAs; then
everything but the row copies, the mbarrier waits and the barriers; the cluster's merge of the
parts), and each side alone (the producers not waiting for consumers, the consumers' math not
waiting for rows). "Row copies and waits only" is the gather's own time in this pipeline, the
ceiling the whole kernel can reach. At H=16 (--heads 16, the warpgroup-MMA consumers): whole, the
producers with consumers that only free each tile, and the consumers' math alone.

    PYTHONPATH=kernels python3 benchmarks/sparse_mla_cuts.py [--heads 8|16] [--slots random|consecutive|shared]

--slots: each request's 2048 rows spread over its 64K-token context (what decode does), its first
2048 rows, or the same 2048 rows for every request (1.3 MB, resident in L2: the copies' own speed).

Cut kernels compute nothing useful; only their times mean something (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from longctx_kernels import cuda_module, measure
from longctx_kernels.sparse_mla import random_fp8_ds_mla_cache
from longctx_kernels.sparse_mla_cuda import sparse_mla_decode_cuda

SOURCE = "sparse_mla_decode.cu"
NO_PV = ("for (int c = 0; c < kChunks; ++c) {", "for (int c = 0; c < 0; ++c) {")
NO_S_MMA = ("for (int k = 0; k < 8; ++k) {", "for (int k = 0; k < 0; ++k) {")
NO_S = ("for (int m = 0; m < kTile / 16; ++m) {", "for (int m = 0; m < 0; ++m) {")
NO_EMPTY_WAIT = ("if (j >= kStages) mbar_wait(&sh.empty[stage], (j / kStages + 1) & 1);", "")
NO_FULL_WAIT = ("  if (kTeams > 1 && i >= kStages) mbar_wait(&sh.empty[stage], ((i - kStages) / kStages) & 1);\n"
                "  mbar_wait(&sh.full[stage], (i / kStages) & 1);", "")
PRODUCE = "    produce(sh, cache, topk + (long long)b * K + k_begin, k_count, n_tiles, lane, warp - kConsumers);\n"
PRODUCERS_MERGE = ('    asm volatile("barrier.cluster.wait;\\n" ::: "memory");\n    cluster_sync();  // every part is in\n'
                   "#if !SPARSE_MLA_WGMMA\n    merge_parts(sh, out, out_lse, b, H, split, tid);\n#endif\n")
NO_CONSUMERS = (PRODUCE + PRODUCERS_MERGE + "    return;\n  }\n",
                PRODUCE + "    return;\n  }\n  if (n_tiles < (1 << 30)) return;  // the consumers leave at once\n")
NO_PRODUCERS = (PRODUCE, "")
# The warpgroup-MMA consumers (9 to 16 heads).
WGMMA_CONSUMERS = "  consume_wgmma(sh, out, out_lse, b, H, n_tiles, team, w, lane, split, qk_scale_log2);\n"
NO_MERGE = ("  merge_parts(sh, out, out_lse, b, H, split, tid);\n#endif\n}", "#endif\n}")
CUTS = {"whole kernel": [], "no merge": [NO_MERGE], "no P.V": [NO_PV], "no P.V, no S MMAs": [NO_PV, NO_S_MMA],
        "row copies and waits only": [NO_PV, NO_S],
        # The two sides alone: the producers streaming the ring without waiting for consumers, and
        # the consumers' math on whatever the ring holds, without waiting for producers.
        "producers alone": [NO_EMPTY_WAIT, NO_CONSUMERS], "consumers' math alone": [NO_EMPTY_WAIT, NO_FULL_WAIT, NO_PRODUCERS]}
# Its producers alone: the consumers only wait for each tile and free it (bulk copies in flight
# must land before the CTA ends, so the ring is not left unwatched).
WGMMA_ONLY_WAIT = ("  for (int i = team; i < n_tiles; i += kTeams) {\n    landed(sh, i);\n    __syncwarp();\n"
                   "    if (lane == 0) mbar_arrive(&sh.empty[i % kStages]);\n  }\n  if (n_tiles < (1 << 30)) return;\n")
WGMMA_CUTS = {"whole kernel": [], "producers alone": [(PRODUCE + PRODUCERS_MERGE, PRODUCE), (WGMMA_CONSUMERS, WGMMA_ONLY_WAIT)],
              "consumers' math alone": [NO_FULL_WAIT, NO_PRODUCERS]}
# The default; 32-row tiles; one team a CTA, 4 slices at 2 CTAs/SM (the eighth round's layout).
LAYOUTS = [dict(), dict(tile=32, stages=6), dict(num_splits=4, teams=1, tile=32, stages=3, ctas_per_sm=2)]


def slot_pattern(pattern: str, batch: int, ctx: int, topk: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, topk] int32 cache slots: request b's context is rows [b ctx, (b + 1) ctx)."""
    if pattern == "random":
        slots = torch.stack([torch.randperm(ctx, device="cuda", generator=gen)[:topk] + b * ctx for b in range(batch)])
    elif pattern == "consecutive":
        slots = torch.arange(batch, device="cuda")[:, None] * ctx + torch.arange(topk, device="cuda")[None]
    else:  # shared: the same rows for every request
        slots = torch.arange(topk, device="cuda")[None].repeat(batch, 1)
    return slots.int().contiguous()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", choices=("random", "consecutive", "shared"), default="random")
    parser.add_argument("--heads", type=int, choices=(8, 16), default=8)
    args = parser.parse_args()
    pattern, heads = args.slots, args.heads
    cuts, layouts = (CUTS, LAYOUTS) if heads == 8 else (WGMMA_CUTS, [dict()])
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, ctx, topk = 64, 65536, 2048
    cache = random_fp8_ds_mla_cache(batch * ctx, gen)
    slots = slot_pattern(pattern, batch, ctx, topk, gen)
    q = torch.randn(batch, heads, 576, device="cuda", generator=gen).bfloat16()
    floor_us = batch * topk * 656 / measure.hbm_copy_bandwidth() * 1e6
    print(f"{pattern} slots: rows {batch * topk * 656 / 1e6:.1f} MB; HBM floor (copy bandwidth) {floor_us:.1f} us")

    # The process's first timings run ~2.5 us slow (clocks ramping): warm the GPU up first.
    for _ in range(3):
        measure.graph_median_ms(lambda: sparse_mla_decode_cuda(q, cache, slots, 576**-0.5), iters=50)
    source = (cuda_module.CSRC / SOURCE).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        for name, edits in cuts.items():
            text = source
            for old, new in edits:
                assert old in text, f"the cut {old!r} no longer matches {SOURCE}"
                text = text.replace(old, new)
            (Path(tmp) / SOURCE).write_text(text)
            cuda_module.CSRC = Path(tmp)
            cuda_module.load.cache_clear()
            for layout in layouts:
                ms = measure.graph_median_ms(lambda: sparse_mla_decode_cuda(q, cache, slots, 576**-0.5, **layout))
                print(f"{name:26s} {layout}: {ms * 1e3:5.1f} us = {ms * 1e3 / floor_us:.2f}x the floor", flush=True)


if __name__ == "__main__":
    main()
