"""Facts about how the Triton kernels are being run."""

from __future__ import annotations

import os

import triton.language as tl


def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def bf16_dot_dtype():
    """Operand dtype for dots that run in bf16 on the GPU.

    Triton's interpreter (3.8) returns garbage for bf16 x bf16 dots, so CPU runs
    use fp32 operands; fp8 -> bf16 and bf16 -> fp32 conversions are exact, so only
    the accumulation order differs from the GPU path.
    """
    return tl.float32 if interpreting() else tl.bfloat16
