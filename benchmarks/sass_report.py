"""Compile the sparse-MLA kernel for an H200 (sm_90) on a machine without a GPU and report
what the compiler made of it: registers, local-memory spills, shared memory, and the main
loop's instruction count and mix, read from the SASS with Triton's bundled cuobjdump.

    PYTHONPATH=kernels python benchmarks/sass_report.py --block-h 16 --block-k 64 --warps 8 --stages 2 --prefetch --fp16

It costs no device time; docs/benchmarks.md uses it to explain the timings.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from longctx_kernels.sparse_mla import _sparse_mla_decode_kernel

SIGNATURE = {
    "q_ptr": "*bf16", "cache_u8": "*u8", "cache_f32": "*fp32", "cache_bf16": "*bf16", "topk_ptr": "*i32",
    "out_ptr": "*bf16", "lse_ptr": "*fp32", "B": "i32", "H": "i32", "K": "i32", "k_per_split": "i32",
    "qk_scale_log2": "fp32",
}
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_sm90(constexprs: dict, num_warps: int, num_stages: int, maxnreg: int | None = None) -> bytes:
    signature = dict(SIGNATURE, **{name: "constexpr" for name in constexprs})
    # As the launcher specializes real calls: 16-byte aligned pointers, K and k_per_split divisible by 16.
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
             if kind.startswith("*") or name in ("K", "k_per_split")}
    source = ASTSource(fn=_sparse_mla_decode_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg))
    return kernel.asm["cubin"], kernel.metadata.shared


def cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(TOOLS, "cuobjdump"), flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def main_loop_opcodes(sass: str) -> collections.Counter:
    """Opcodes between the target and the source of the longest backward branch (the k-tile loop)."""
    insts = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in
             re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_]+)(?:\.[A-Z0-9_.]+)?\s*([^;]*);", sass)]
    loops = [(addr - int(arg, 16), int(arg, 16), addr) for addr, op, arg in insts
             if op == "BRA" and arg.startswith("0x") and int(arg, 16) < addr]
    if not loops:
        return collections.Counter()
    _, start, end = max(loops)
    return collections.Counter(op for addr, op, _ in insts if start <= addr <= end)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block-h", type=int, default=16)
    p.add_argument("--block-k", type=int, default=16)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--col-splits", type=int, default=1)
    p.add_argument("--prefetch", action="store_true")
    p.add_argument("--fp16", action="store_true", help="fp16 MMA operands (default bf16)")
    p.add_argument("--maxnreg", type=int, help="register cap per thread (more programs per SM, maybe spills)")
    args = p.parse_args()
    constexprs = dict(BLOCK_H=args.block_h, BLOCK_K=args.block_k, NCOL=args.col_splits, PREFETCH=args.prefetch,
                      DOT_DTYPE=tl.float16 if args.fp16 else tl.bfloat16)
    cubin, shared = compile_sm90(constexprs, args.warps, args.stages, args.maxnreg)
    usage = cuobjdump(cubin, "--dump-resource-usage")
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    loop = main_loop_opcodes(cuobjdump(cubin, "--dump-sass"))
    threads = 32 * args.warps
    programs = min(65536 // (regs * threads), (227 << 10) // max(shared, 1), 64 // args.warps)
    per_row = sum(loop.values()) * args.warps / args.block_k * args.col_splits
    print(f"registers {regs}/thread, spill stack {stack} B, shared {shared} B -> {programs} program(s)/SM, "
          f"{programs * args.warps / 4:g} warps per scheduler")
    print(f"k-tile loop: {sum(loop.values())} instructions per warp per {args.block_k}-row tile = "
          f"{per_row:.0f} warp-instructions per 656-B row")
    print("mix:", ", ".join(f"{op} {n}" for op, n in loop.most_common(10)))


if __name__ == "__main__":
    main()
