"""Edge-case correctness of the hand-written CUDA kernels on a GPU (CI has none; the CPU suite
compiles them with NVRTC and checks registers and spills). Prints one line per case, exits 1 on
any failure. Run:  PYTHONPATH=kernels python3 benchmarks/cuda_kernel_checks.py
"""

from __future__ import annotations

import sys

import torch

from longctx_kernels.indexer import radix_topk_cuda, topk_reference
from longctx_kernels.measure import relative_error as rel
from longctx_kernels.sparse_mla import pack_fp8_ds_mla_rows, sparse_mla_decode_reference
from longctx_kernels.sparse_mla_cuda import sparse_mla_decode_auto, sparse_mla_decode_cuda, sparse_mla_decode_wgmma


def _mla_case(decode, cache: torch.Tensor, batch: int, heads: int, k: int, padded: bool, gen: torch.Generator) -> tuple[float, bool]:
    """decode(q, cache, slots, scale, out, lse) on NaN-poisoned outputs against the reference:
    (error, passed). `padded`: padding slots in the first request and nothing selected in the last."""
    q = torch.randn(batch, heads, 576, device="cuda", generator=gen).bfloat16()
    slots = torch.randint(0, cache.shape[0] * cache.shape[1], (batch, k), device="cuda", generator=gen, dtype=torch.int32)
    if padded:
        slots[0, : k // 3] = -1
        slots[-1] = -1
    ref, ref_lse = sparse_mla_decode_reference(q, cache, slots, 576**-0.5)
    out = torch.full((batch, heads, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((batch, heads), float("nan"), device="cuda")
    decode(q, cache, slots, 576**-0.5, out, lse)
    seen = ~torch.isinf(ref_lse)
    err = rel(out, ref)
    ok = (err < 1e-2 and rel(lse[seen], ref_lse[seen]) < 1e-5 and bool((torch.isinf(lse) == torch.isinf(ref_lse)).all())
          and (not padded or bool((out[-1] == 0).all())))
    return err, ok


def sparse_mla_cases(gen: torch.Generator) -> list[tuple[str, bool]]:
    results = []
    cache = pack_fp8_ds_mla_rows(torch.randn(4096, 576, device="cuda", generator=gen) * 2).reshape(64, 64, 656)
    # mma.sync layouts (tile, stages, teams, producers, CTAs/SM): the default (tile and stages by
    # head count), one team and one producer, one team at 2 CTAs/SM, four producers.
    for tile, stages, teams, producers, ctas in ((None, None, 2, 2, 1), (64, 3, 1, 1, 1), (32, 3, 1, 2, 2), (32, 5, 2, 4, 1)):
        for batch, heads, k, splits, padded in ((2, 8, 64, 1, False), (2, 16, 128, 1, False), (3, 8, 192, 2, True),
                                                (2, 5, 100, 4, True), (2, 8, 2048, 4, True), (3, 13, 300, 2, True),
                                                (3, 8, 300, 4, True), (2, 16, 2048, 2, True)):
            err, ok = _mla_case(lambda q, c, s, sc, o, l: sparse_mla_decode_cuda(
                q, c, s, sc, num_splits=splits, tile=tile, stages=stages, teams=teams, producers=producers,
                ctas_per_sm=ctas, out=o, out_lse=l, wgmma=False), cache, batch, heads, k, padded, gen)
            results.append((f"sparse MLA tile={tile} stages={stages} teams={teams} producers={producers} ctas={ctas} "
                            f"B={batch} H={heads} K={k} splits={splits} padded={padded}: err {err:.1e}", ok))
    # The few-head kernel on warpgroup MMAs (9 to 16 heads): the default (2 teams, 4 producers, 3
    # stages), one team of two producers (no register split) in 3 and 4 stages; lists shorter than
    # a tile, a short last tile, empty slices.
    for stages, teams, producers in ((None, None, None), (None, 1, 2), (4, 1, 2)):
        for batch, heads, k, splits, padded in ((2, 16, 64, 1, False), (2, 16, 128, 1, False), (3, 9, 192, 2, True),
                                                (2, 12, 100, 4, True), (2, 16, 2048, 4, True), (3, 13, 300, 2, True),
                                                (3, 16, 300, 1, True), (2, 16, 2048, 2, True), (2, 16, 20, 4, True),
                                                (2, 15, 64, 2, False)):
            err, ok = _mla_case(lambda q, c, s, sc, o, l: sparse_mla_decode_cuda(
                q, c, s, sc, num_splits=splits, stages=stages, teams=teams, producers=producers, out=o, out_lse=l,
                wgmma=True), cache, batch, heads, k, padded, gen)
            results.append((f"sparse MLA wgmma stages={stages} teams={teams} producers={producers} "
                            f"B={batch} H={heads} K={k} splits={splits} padded={padded}: err {err:.1e}", ok))
    # The wgmma kernel: 64 heads a CTA (fewer are zero rows, more take several CTAs), slices of the
    # list (a cluster of 2, 4 or 8 merging in the kernel) with a short last tile, a list shorter than
    # one tile, one request spread over 8 slices, slices left empty.
    for batch, heads, k, splits, padded in ((2, 64, 64, 1, False), (2, 64, 2048, None, True), (3, 64, 300, 2, True),
                                            (2, 64, 100, 4, True), (3, 64, 20, 1, True), (1, 64, 2048, None, False),
                                            (2, 128, 256, None, True), (3, 17, 192, 2, True), (2, 100, 300, 4, True),
                                            (2, 64, 2048, 2, True), (3, 64, 100, 8, True)):
        err, ok = _mla_case(lambda q, c, s, sc, o, l: sparse_mla_decode_wgmma(q, c, s, sc, num_splits=splits, out=o,
                                                                             out_lse=l), cache, batch, heads, k, padded, gen)
        results.append((f"sparse MLA wgmma B={batch} H={heads} K={k} splits={splits} padded={padded}: err {err:.1e}", ok))
    # Every head count the dispatcher takes to a CUDA kernel, on both sides of its 8- and 16-head switches.
    for heads in (1, 2, 5, 8, 9, 13, 16, 17, 24, 32, 48, 63, 64, 65, 96, 128):
        err, ok = _mla_case(lambda q, c, s, sc, o, l: sparse_mla_decode_auto(q, c, s, sc, out=o, out_lse=l),
                            cache, 3, heads, 300, True, gen)
        results.append((f"sparse MLA dispatch H={heads} B=3 K=300 padded: err {err:.1e}", ok))
    # Small keys: group scales far below f16's normal range (about 2e-6 here), which a kernel must
    # not round as f16 subnormals; held to the 3e-3 error of the kernels' goal.
    small = pack_fp8_ds_mla_rows(torch.randn(4096, 576, device="cuda", generator=gen) * 3e-4).reshape(64, 64, 656)
    for heads in (8, 16, 64):
        err, ok = _mla_case(lambda q, c, s, sc, o, l: sparse_mla_decode_auto(q, c, s, sc, out=o, out_lse=l),
                            small, 4, heads, 2048, True, gen)
        results.append((f"sparse MLA dispatch H={heads} B=4 K=2048 padded, keys x 3e-4: err {err:.1e}", ok and err < 3e-3))
    return results


def _sampled_chunks(n: int) -> torch.Tensor:
    """Mask of the float4 chunks of a row of n logits that the kernel's sample reads."""
    chunks = (n + 3) // 4
    sampled = torch.zeros(chunks, dtype=torch.bool)
    sampled[torch.arange(2048) * chunks // 2048] = True
    return sampled


def _large_logits_at(rows: int, length: int, lens: torch.Tensor, gen: torch.Generator, in_sample: bool,
                     count: int) -> torch.Tensor:
    # Put `count` large logits (4 a chunk) in chunks the sample reads, or in chunks it does not.
    logits = torch.randn(rows, length, device="cuda", generator=gen)
    for b in range(rows):
        n = int(lens[b])
        chunks = _sampled_chunks(n)
        chosen = (chunks if in_sample else ~chunks).nonzero().flatten()[: count // 4]
        pos = (chosen[:, None] * 4 + torch.arange(4)).flatten()
        pos = pos[pos < n].cuda()
        logits[b, pos] = 1e6 + torch.rand(pos.numel(), device="cuda", generator=gen)
    return logits


def _same_set(row_logits: torch.Tensor, ids: torch.Tensor, ref_ids: torch.Tensor) -> bool:
    """`ids` are distinct and select the same logits as `ref_ids` (ties in any order)."""
    return (ids.unique().numel() == ids.numel()
            and torch.equal(row_logits[ids.long()].sort().values, row_logits[ref_ids.long()].sort().values))


def topk_cases(gen: torch.Generator) -> list[tuple[str, bool]]:
    rows, length = 6, 70000
    lens = torch.tensor([length, 50000, 2048, 100, 65536, 4097], device="cuda", dtype=torch.int32)
    cases = {
        "random, mixed lengths": (torch.randn(rows, length, device="cuda", generator=gen), lens),
        "heavy ties (5 values)": (torch.randint(0, 5, (rows, length), device="cuda", generator=gen).float(), lens),
        "all equal": (torch.full((rows, length), 3.0, device="cuda"), lens),
        "tiny negatives": (-torch.rand(rows, length, device="cuda", generator=gen) * 1e-3, lens),
        "ascending rows": (torch.arange(length, device="cuda").float().expand(rows, length).contiguous(), lens),
        # 3000 large logits the sample never sees: the listed range comes from the listed keys.
        "large logits outside the sample": (_large_logits_at(rows, length, lens, gen, False, 3000), lens),
        # The sample is all large logits: its threshold lists fewer than k ids, so the select
        # falls back to the whole row.
        "large logits only in the sample": (_large_logits_at(rows, length, lens, gen, True, 8192), lens),
        # -inf is never a candidate: rows with fewer finite logits than k need the fallback too.
        "mostly -inf": (torch.randn(rows, length, device="cuda", generator=gen).masked_fill(
            torch.rand(rows, length, device="cuda", generator=gen) < 0.99, float("-inf")), lens),
        # max_len not a multiple of 4: the rows are not 16-B aligned, so the kernel reads scalars.
        "odd row length (scalar loads)": (torch.randn(rows, length + 1, device="cuda", generator=gen),
                                          torch.tensor([length + 1, 50001, 2049, 101, 65537, 4099], device="cuda",
                                                       dtype=torch.int32)),
    }
    # A list capacity of 256 sends most rounds to the row-scan path (lists that overflow); 4 CTAs a
    # row list the candidates in a first kernel (with 256, they overflow its global list too).
    results = []
    for k, list_cap, ctas in ((2048, 8192, 1), (100, 8192, 1), (2048, 256, 1), (2048, 8192, 4), (2048, 256, 4)):
        for name, (logits, row_lens) in cases.items():
            out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")  # an unwritten slot fails
            radix_topk_cuda(logits, row_lens, k, out=out, list_cap=list_cap, ctas_per_row=ctas)
            ref = topk_reference(logits, row_lens, k)
            ok = True
            for b in range(rows):
                n = int(row_lens[b])
                kk = min(n, k)
                ids = out[b, :kk]
                ok &= bool((out[b, kk:] == -1).all() and (ids >= 0).all() and (ids < n).all())
                ok &= _same_set(logits[b], ids, ref[b, :kk])
            results.append((f"top-k k={k} list_cap={list_cap} ctas/row={ctas}: {name}", ok))
    # Rows of a 1M-token context, with one CTA a row and with the default (16 listing CTAs a row).
    long_lens = torch.tensor([1 << 20, 700001], device="cuda", dtype=torch.int32)
    long_logits = torch.randn(2, 1 << 20, device="cuda", generator=gen)
    ref = topk_reference(long_logits, long_lens, 2048)
    for ctas in (1, None):
        out = torch.full((2, 2048), -7, dtype=torch.int32, device="cuda")
        radix_topk_cuda(long_logits, long_lens, 2048, out=out, ctas_per_row=ctas)
        ok = all(_same_set(long_logits[b], out[b], ref[b]) for b in range(2))
        results.append((f"top-k k=2048 ctas/row={ctas or 'default'}: rows of 1M and 700,001 logits", ok))
    return results


def main() -> int:
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = sparse_mla_cases(gen) + topk_cases(gen)
    for line, ok in results:
        print(f"{'PASS' if ok else 'FAIL'}  {line}")
    failed = sum(not ok for _, ok in results)
    print(f"{len(results) - failed}/{len(results)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
