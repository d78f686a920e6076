"""``longctx-kernels preflight``: is this node fit to serve?

Checks, each against a threshold (options below, defaults for an H200 SXM node):
HBM copy bandwidth, pinned host-to-device bandwidth, an NCCL all-gather over the
visible GPUs, one Triton kernel's correctness (sparse MLA decode against its
PyTorch reference), and a NIXL READ between two agents over UCX (GPU memory
when CUDA is available, host memory otherwise).

Exit codes:
  0  every check that could run passed (a 1-GPU node skips the all-gather);
  1  a check failed: do not serve on this node;
  2  no GPU is visible: the host-memory NIXL check ran (and passed), the GPU
     checks could not. ``--allow-no-gpu`` turns this into 0 (CPU-only CI).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass
class Check:
    name: str
    value: str
    threshold: str
    verdict: str
    note: str = ""


def _run(name: str, threshold: str, fn) -> Check:
    """fn() -> (value text, passed, note); any exception is a FAIL with its message."""
    try:
        value, passed, note = fn()
        return Check(name, value, threshold, PASS if passed else FAIL, note)
    except Exception as exc:  # a check that crashes is a failed check, not a crashed preflight
        return Check(name, "-", threshold, FAIL, f"{type(exc).__name__}: {exc}".splitlines()[0][:160])


def _kernel_check():
    """Sparse MLA by the Triton kernel (64 heads) and the NVRTC-compiled CUDA kernel (8 heads) on
    NaN-poisoned outputs, and the CUDA top-k with ties: a node whose NVRTC or driver API fails is caught."""
    import torch

    from .indexer import radix_topk_cuda
    from .measure import exact_topk, relative_error
    from .sparse_mla import pack_fp8_ds_mla_rows, sparse_mla_decode, sparse_mla_decode_reference
    from .sparse_mla_cuda import sparse_mla_decode_cuda

    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = pack_fp8_ds_mla_rows(torch.randn(64 * 64, 576, device="cuda", generator=gen)).reshape(64, 64, 656)
    slots = torch.randint(0, 64 * 64, (4, 2048), device="cuda", generator=gen, dtype=torch.int32)
    errors = []
    for heads, decode in ((64, sparse_mla_decode), (8, sparse_mla_decode_cuda)):
        q = torch.randn(4, heads, 576, device="cuda", generator=gen).bfloat16()
        out = torch.full((4, heads, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
        decode(q, cache, slots, 576**-0.5, num_splits=4, out=out)
        errors.append(relative_error(out, sparse_mla_decode_reference(q, cache, slots, 576**-0.5)[0]))
    logits = torch.randint(0, 1000, (4, 65536), device="cuda", generator=gen).float()  # many ties
    lengths = torch.full((4,), 65536, device="cuda", dtype=torch.int32)
    topk_ok = exact_topk(logits, radix_topk_cuda(logits, lengths, 2048))
    return (f"rel err {max(errors):.1e}, top-k {'exact' if topk_ok else 'WRONG'}", max(errors) < 1e-2 and topk_ok,
            "sparse MLA (Triton H=64, CUDA H=8) vs PyTorch; CUDA top-k vs torch.topk")


def write_profile(path: str) -> None:
    """Measures this node's GPU 0 (HBM copy, bf16 matmul, pinned H2D, an all-gather when a
    second GPU is visible) and writes a hardware profile for `longctx plan --hardware`; the
    rates it does not measure keep the H200 default's, fp8 is taken as twice bf16."""
    import dataclasses

    import torch
    from longctx_core.sizing import hardware

    from . import measure

    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bf16 = 2 * 8192**3 / (measure.median_ms(lambda: x @ x) * 1e-3)
    rates = {"hbmBytesPerS": measure.hbm_copy_bandwidth(), "bf16FlopsPerS": bf16,
             "fp8FlopsPerS": 2 * bf16, "pcieBytesPerS": measure.pinned_copy_bandwidth()}
    if torch.cuda.device_count() > 1:
        ok, bus, _ = measure.all_gather_bandwidth()
        if ok:
            rates["nvlinkBytesPerS"] = bus
    name = f"{torch.cuda.get_device_name(0)} (measured by longctx-kernels preflight)"
    hardware.save_profile(dataclasses.replace(hardware.H200, name=name, **rates), path)
    print(f"profile: {path}: " + ", ".join(f"{k} {v:.3g}" for k, v in rates.items()))


def preflight(args: argparse.Namespace) -> int:
    checks: list[Check] = []
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if args.write_profile:
        if not has_gpu:
            print(f"error: --write-profile {args.write_profile}: no CUDA GPU is visible, so "
                  "nothing can be measured; run it on the GPU node (longctx plan uses the H200 "
                  "default without --hardware)", file=sys.stderr)
            return 1
        write_profile(args.write_profile)
    if has_gpu:
        from . import measure

        gpus = torch.cuda.device_count()
        name = torch.cuda.get_device_name(0)
        print(f"node: {gpus} x {name}, torch {torch.__version__}")
        def hbm():
            bw = measure.hbm_copy_bandwidth() / 1e12
            return f"{bw:.2f} TB/s", bw >= args.min_hbm_tbs, "2 GiB device copy, read+write"

        def h2d():
            bw = measure.pinned_copy_bandwidth() / 1e9
            return f"{bw:.1f} GB/s", bw >= args.min_h2d_gbs, "1 GiB pinned host -> device"

        checks.append(_run("HBM copy bandwidth", f">= {args.min_hbm_tbs} TB/s", hbm))
        checks.append(_run("pinned H2D bandwidth", f">= {args.min_h2d_gbs} GB/s", h2d))
        if gpus < 2:
            checks.append(Check("NCCL all-gather", "-", f">= {args.min_allgather_gbs} GB/s", SKIP,
                                "only 1 GPU visible: nothing to gather across"))
        else:
            def all_gather():
                ok, bus, ms = measure.all_gather_bandwidth()
                return (f"{bus / 1e9:.0f} GB/s bus", ok and bus / 1e9 >= args.min_allgather_gbs,
                        f"{gpus} GPUs, 64 MiB/rank, {ms:.3f} ms, data {'correct' if ok else 'WRONG'}")
            checks.append(_run("NCCL all-gather", f">= {args.min_allgather_gbs} GB/s", all_gather))
        checks.append(_run("kernel correctness", "err < 1e-2, exact", _kernel_check))
    else:
        print("node: no CUDA GPU visible: GPU checks (HBM, H2D, all-gather, kernel) were not possible")
    device = "cuda" if has_gpu else "cpu"
    min_nixl = args.min_nixl_vram_gbs if has_gpu else args.min_nixl_dram_gbs

    def nixl():
        from .nixl_check import nixl_two_agent_transfer

        r = nixl_two_agent_transfer(num_bytes=args.nixl_mib << 20, device=device)
        ok = r.bit_exact and r.gbytes_per_s >= min_nixl
        note = f"UCX READ {args.nixl_mib} MiB {r.memory}, {'bit-exact' if r.bit_exact else 'DATA MISMATCH'}"
        if has_gpu and not ok:
            # Seen on a sandboxed H200 (2026-11-30): with no cuda_ipc and no RDMA, UCX_PROTO_INFO=y shows
            # GPU reads done by "software emulation" over tcp/lo at 0.4 GB/s.
            note += "; UCX found no GPU-direct path (cuda_ipc, RDMA): UCX_PROTO_INFO=y shows the one it took"
        return f"{r.gbytes_per_s:.1f} GB/s", ok, note
    checks.append(_run(f"NIXL 2-agent transfer ({'VRAM' if has_gpu else 'DRAM'})", f">= {min_nixl} GB/s", nixl))

    _print_table(checks)
    if any(c.verdict == FAIL for c in checks):
        print("verdict: BAD NODE (exit 1)")
        return 1
    if not has_gpu:
        code = 0 if args.allow_no_gpu else 2
        print(f"verdict: host checks passed; GPU checks not possible (exit {code})")
        return code
    print("verdict: GOOD NODE (exit 0)")
    return 0


def _print_table(checks: list[Check]) -> None:
    headers = ("check", "value", "threshold", "verdict", "note")
    rows = [(c.name, c.value, c.threshold, c.verdict, c.note) for c in checks]
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    for row in [headers, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="longctx-kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight", help="check this node before serving (see module doc for exit codes)")
    p.add_argument("--min-hbm-tbs", type=float, default=3.5, help="HBM copy TB/s (H200 measures ~4.2)")
    p.add_argument("--min-h2d-gbs", type=float, default=40.0, help="pinned H2D GB/s (PCIe Gen5 x16 ~55)")
    p.add_argument("--min-allgather-gbs", type=float, default=100.0, help="NCCL all-gather bus GB/s (NVLink)")
    p.add_argument("--min-nixl-vram-gbs", type=float, default=5.0, help="NIXL GPU-memory READ GB/s")
    p.add_argument("--min-nixl-dram-gbs", type=float, default=0.5, help="NIXL host-memory READ GB/s")
    p.add_argument("--nixl-mib", type=int, default=256, help="NIXL transfer size in MiB")
    p.add_argument("--allow-no-gpu", action="store_true", help="exit 0 instead of 2 when no GPU is visible")
    p.add_argument("--write-profile", metavar="FILE", help="also measure this node's rates into a "
                   "hardware profile for `longctx plan --hardware FILE` (needs a GPU)")
    args = parser.parse_args(argv)
    try:
        return preflight(args)
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
