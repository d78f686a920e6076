"""The kernels of one PCP8 x EP8 prefill step of a 2K-token chunk, at their own shapes, on one H200:
the efficiencies the performance model reads (core/longctx_core/sizing/hardware.py).

Per GPU the chunk is 256 query tokens (2048 / PCP8). Each kernel is timed with CUDA events
(median of repeats, inputs larger than L2 or rotated), and set against its floor, the larger of
its bytes (each input read once, each output written once) over the HBM copy bandwidth measured
in this run and its FLOPs over twice the bf16 matmul rate measured in this run (Hopper's fp8 rate):

- routed experts: an fp8 grouped GEMM (torch._scaled_grouped_mm, CUTLASS, rowwise scales) over
  the 32 local experts of EP8, gate/up [6144 -> 4096] and down [2048 -> 6144], at 64 rows an
  expert (2048 tokens x 8 experts / 256) and at 32 and 128 for the trend;
- projections: fp8 GEMMs (torch._scaled_mm, cuBLASLt) of the attention, indexer and shared-expert
  shapes at M = 256 (and 1024, 8192: the rows a GPU computes in an 8K chunk under PCP8 and DP);
- top-k: 2048 of each row of fp32 logits, 256 rows of 67,584 (64K cached + 2K) and 253,952
  (248K + 2K) columns: the project's radix top-k (csrc/radix_topk.cu) and torch.topk;
- kernel cost in an eager stream: back-to-back one-element kernels queued behind a long one, so
  the host is ahead and the GPU pays only its own per-kernel cost; and the host's cost to issue one.

    PYTHONPATH=kernels python3 benchmarks/prefill_step_kernels.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from longctx_kernels import measure
from longctx_kernels.indexer import radix_topk_cuda

FP8 = torch.float8_e4m3fn
HIDDEN, MOE_INTER, LOCAL_EXPERTS = 6144, 2048, 32
# 256: a 2K chunk's rows a GPU under PCP8; 1024: an 8K chunk's; 8192: an 8K chunk on one GPU (DP).
PROJECTION_ROWS = (256, 1024, 8192)
ROWS: list[dict] = []
CEIL: dict[str, float] = {}


def events_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    return measure.median_ms(fn, iters, warmup)


def record(kernel: str, shape: str, ms: float, bytes_: float, flops: float, note: str = "") -> None:
    t_bytes = bytes_ / CEIL["hbm"] * 1e3
    t_flops = flops / CEIL["fp8"] * 1e3
    floor = max(t_bytes, t_flops)
    ROWS.append(dict(kernel=kernel, shape=shape, us=ms * 1e3, floor_us=floor * 1e3,
                     bound="HBM" if t_bytes >= t_flops else "fp8 MMA", efficiency=floor / ms,
                     note=note))


def fp8_weights(groups: int, k: int, n: int) -> torch.Tensor:
    """(groups, k, n) fp8, column-major in its last two dimensions (_scaled_grouped_mm's B)."""
    w = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16).to(FP8)
    return w.transpose(-2, -1)


def experts() -> None:
    for rows in (32, 64, 128):
        for name, k, n in (("gate/up", HIDDEN, 2 * MOE_INTER), ("down", MOE_INTER, HIDDEN)):
            sets = [fp8_weights(LOCAL_EXPERTS, k, n) for _ in range(2)]   # 2 x >0.4 GB > L2
            scale_b = torch.ones(LOCAL_EXPERTS, n, device="cuda")
            a = torch.randn(LOCAL_EXPERTS * rows, k, device="cuda", dtype=torch.bfloat16).to(FP8)
            scale_a = torch.ones(LOCAL_EXPERTS * rows, device="cuda")
            offs = torch.arange(rows, LOCAL_EXPERTS * rows + 1, rows, device="cuda",
                                dtype=torch.int32)
            turn = [0]

            def call():
                turn[0] ^= 1
                return torch._scaled_grouped_mm(a, sets[turn[0]], scale_a, scale_b, offs=offs,
                                                out_dtype=torch.bfloat16)
            ref = torch._scaled_grouped_mm(a, sets[0], scale_a, scale_b, offs=offs,
                                           out_dtype=torch.bfloat16)
            expect = (a[:rows].to(torch.bfloat16) @ sets[0][0].to(torch.bfloat16))
            err = measure.relative_error(ref[:rows], expect)
            burst = 10   # back-to-back calls, so the host's launch cost stays out
            ms = events_ms(lambda: [call() for _ in range(burst)]) / burst
            weight = LOCAL_EXPERTS * k * n
            record(f"expert GEMM {name} (fp8 grouped)", f"{LOCAL_EXPERTS} experts x {rows} rows, "
                   f"K={k} N={n}", ms, weight + a.numel() + 2 * LOCAL_EXPERTS * rows * n,
                   2 * LOCAL_EXPERTS * rows * k * n, f"err {err:.1e}")
            del sets


def projections() -> None:
    for m in PROJECTION_ROWS:
        projections_at(m)


def projections_at(m: int) -> None:
    for name, k, n in (("q_a + kv_a", HIDDEN, 2048 + 576), ("q_b", 2048, 64 * 256),
                       ("o_proj", 64 * 256, HIDDEN), ("shared gate/up", HIDDEN, 2 * MOE_INTER),
                       ("indexer wq_b", 2048, 32 * 128)):
        sets = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16).to(FP8).t()
                for _ in range(measure.cold_sets_needed(k * n))]
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16).to(FP8)
        sa, sb = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
        calls = [lambda w=w: torch._scaled_mm(a, w, sa, sb, out_dtype=torch.bfloat16)
                 for w in sets]
        ms = measure.cold_graph_median_ms(calls, k * n + m * k + 2 * m * n)
        record(f"projection {name} (fp8 dense)", f"M={m} K={k} N={n}", ms,
               k * n + m * k + 2 * m * n, 2 * m * k * n)


def topk() -> None:
    rows, k = 256, 2048
    for cols in (65536 + 2048, 253952):
        per_set = 4 * rows * cols
        sets = [torch.randn(rows, cols, device="cuda")
                for _ in range(measure.cold_sets_needed(per_set))]
        lens = torch.full((rows,), cols, device="cuda", dtype=torch.int32)
        out = torch.empty(rows, k, device="cuda", dtype=torch.int32)
        ids = radix_topk_cuda(sets[0], lens, k, out=out)
        exact = measure.exact_topk(sets[0], ids)
        ms = measure.cold_graph_median_ms(
            [lambda s=s: radix_topk_cuda(s, lens, k, out=out) for s in sets], per_set)
        record("top-k 2048, radix (project CUDA)", f"{rows} rows x {cols}", ms,
               per_set + 4 * rows * k, 0, "exact set" if exact else "WRONG SET")
        ms = measure.cold_graph_median_ms([lambda s=s: torch.topk(s, k, dim=1) for s in sets],
                                          per_set)
        record("top-k 2048, torch.topk", f"{rows} rows x {cols}", ms, per_set + 12 * rows * k, 0)
        del sets


def launches() -> None:
    """GPU time a kernel costs when the host is ahead, and the host time to issue one."""
    x = torch.zeros(1, device="cuda")
    n = 500
    per_kernel = []
    for _ in range(10):
        torch.cuda._sleep(100_000_000)      # ~50 ms: the host queues the burst meanwhile
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            x.add_(1.0)
        end.record()
        end.synchronize()
        per_kernel.append(start.elapsed_time(end) / n)
    host = []
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        host.append((time.perf_counter() - t0) / n)
        torch.cuda.synchronize()
    graphed = measure.graph_median_ms(lambda: x.add_(1.0), reps=n)
    CEIL.update(eager_kernel_us=statistics.median(per_kernel) * 1e3,
                graph_kernel_us=graphed * 1e3, host_issue_us=statistics.median(host) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    CEIL["hbm"] = measure.hbm_copy_bandwidth()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    CEIL["bf16"] = 2 * 8192 ** 3 / (events_ms(lambda: a @ a, 10) * 1e-3)
    CEIL["fp8"] = 2 * CEIL["bf16"]
    del a
    for step in (projections, experts, topk, launches):
        try:
            step()
        except Exception as exc:   # one failing class must not hide the others' figures
            print(f"{step.__name__}: FAILED {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: HBM copy "
          f"{CEIL['hbm'] / 1e12:.2f} TB/s, bf16 matmul {CEIL['bf16'] / 1e12:.0f} TFLOP/s "
          f"(fp8 floor at twice that)")
    for key in ("eager_kernel_us", "graph_kernel_us", "host_issue_us"):
        if key in CEIL:
            print(f"{key}: {CEIL[key]:.2f}")
    print("| kernel | shape | µs | floor (µs) | bound | floor / time | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in ROWS:
        print(f"| {r['kernel']} | {r['shape']} | {r['us']:.1f} | {r['floor_us']:.1f} | "
              f"{r['bound']} | {r['efficiency']:.2f} | {r['note']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": CEIL, "rows": ROWS}, f, indent=2)


if __name__ == "__main__":
    main()
