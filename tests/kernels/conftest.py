"""Kernel tests run every Triton kernel on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before a kernel module is decorated, so it is set
here, at conftest import, before any test module imports longctx_kernels. It
applies to this pytest process; nothing outside tests/kernels imports Triton
kernels, and on a CPU-only machine there is no other way to run them anyway.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ImportError as exc:  # fail loudly: a skipped kernel suite would look green
    raise ImportError(
        f"tests/kernels need torch and triton ({exc}); install them with: pip install -e '.[kernels]'"
    ) from exc

import pytest  # noqa: E402


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64; NaN anywhere gives inf."""
    a, e = actual.double(), expected.double()
    if torch.isnan(a).any():
        return float("inf")
    return ((a - e).norm() / e.norm().clamp(min=1e-300)).item()


@pytest.fixture
def gen() -> torch.Generator:
    """Fresh random inputs per run; the seed is printed, so pytest shows it on failure."""
    seed = int(os.environ.get("LONGCTX_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"LONGCTX_TEST_SEED={seed}")
    return torch.Generator().manual_seed(seed)
