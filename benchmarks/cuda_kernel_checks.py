"""Edge-case correctness of the hand-written CUDA kernels on a GPU (CI has none; the CPU suite
compiles them with NVRTC and checks registers and spills). Prints one line per case, exits 1 on
any failure. Run:  PYTHONPATH=kernels python3 benchmarks/cuda_kernel_checks.py
"""

from __future__ import annotations

import sys

import torch

from longctx_kernels.indexer import radix_topk_cuda, topk_reference
from longctx_kernels.measure import relative_error as rel
from longctx_kernels.sparse_mla import pack_fp8_ds_mla_rows, sparse_mla_decode_cuda, sparse_mla_decode_reference


def sparse_mla_cases(gen: torch.Generator) -> list[tuple[str, bool]]:
    results = []
    cache = pack_fp8_ds_mla_rows(torch.randn(4096, 576, device="cuda", generator=gen) * 2).reshape(64, 64, 656)
    for warps, tile, ctas in ((4, 64, 2), (8, 64, 2), (4, 32, 3)):
        for batch, heads, k, splits, padded in ((2, 8, 64, 1, False), (2, 16, 128, 1, False), (3, 8, 192, 2, True),
                                                (2, 5, 100, 1, True)):
            q = torch.randn(batch, heads, 576, device="cuda", generator=gen).bfloat16()
            slots = torch.randint(0, 4096, (batch, k), device="cuda", generator=gen, dtype=torch.int32)
            if padded:  # padding slots, and a request with nothing selected
                slots[0, : k // 3] = -1
                slots[-1] = -1
            ref, ref_lse = sparse_mla_decode_reference(q, cache, slots, 576**-0.5)
            out = torch.full((batch, heads, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
            lse = torch.full((batch, heads), float("nan"), device="cuda")
            sparse_mla_decode_cuda(q, cache, slots, 576**-0.5, num_splits=splits, num_warps=warps, tile=tile,
                                   ctas_per_sm=ctas, out=out, out_lse=lse)
            seen = ~torch.isinf(ref_lse)
            ok = (rel(out, ref) < 1e-2 and rel(lse[seen], ref_lse[seen]) < 1e-5
                  and bool((torch.isinf(lse) == torch.isinf(ref_lse)).all()))
            results.append((f"sparse MLA warps={warps} tile={tile} ctas={ctas} B={batch} H={heads} K={k} "
                            f"splits={splits} padded={padded}: err {rel(out, ref):.1e}", ok))
    return results


def topk_cases(gen: torch.Generator) -> list[tuple[str, bool]]:
    rows, length = 6, 70000
    lens = torch.tensor([length, 50000, 2048, 100, 65536, 4097], device="cuda", dtype=torch.int32)
    cases = {
        "random, mixed lengths": torch.randn(rows, length, device="cuda", generator=gen),
        "heavy ties (5 values)": torch.randint(0, 5, (rows, length), device="cuda", generator=gen).float(),
        "all equal": torch.full((rows, length), 3.0, device="cuda"),
        "tiny negatives": -torch.rand(rows, length, device="cuda", generator=gen) * 1e-3,
    }
    results = []
    for k in (2048, 100):
        for name, logits in cases.items():
            out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")  # an unwritten slot fails
            radix_topk_cuda(logits, lens, k, out=out)
            ref = topk_reference(logits, lens, k)
            ok = True
            for b in range(rows):
                n = int(lens[b])
                kk = min(n, k)
                ids = out[b, :kk]
                ok &= bool((out[b, kk:] == -1).all() and (ids >= 0).all() and (ids < n).all())
                ok &= ids.unique().numel() == kk
                ok &= torch.equal(logits[b, ids.long()].sort().values, logits[b, ref[b, :kk].long()].sort().values)
            results.append((f"top-k k={k}: {name}", ok))
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
