"""The hand-written CUDA kernels compile with NVRTC for an H200 (sm_90) on this GPU-less host,
without spills; their results are checked against the references by benchmarks/kernels_bench.py
on an H200 (docs/benchmarks.md)."""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import triton

from longctx_kernels.cuda_module import CSRC, CudaError, compile_cubin

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def cuobjdump(cubin: bytes, flag: str) -> str:
    env = dict(os.environ, PATH=os.path.dirname(CUOBJDUMP) + os.pathsep + os.environ.get("PATH", ""))  # its nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([CUOBJDUMP, flag, f.name], capture_output=True, text=True, check=True, env=env).stdout


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers, stack and local memory of the cubin's kernels (the largest, when it has several)."""
    out = cuobjdump(cubin, "--dump-resource-usage")
    usage: dict[str, int] = {}
    for key, value in re.findall(r"(REG|STACK|LOCAL):(\d+)", out):
        usage[key] = max(usage.get(key, 0), int(value))
    return usage


# (tile, stages, teams, producers, CTAs/SM, head tiles): the defaults for 8 and for 16 heads and the
# other layouts benchmarks/cuda_kernel_checks.py runs; clusters of 1, 2 and 4 slices.
@pytest.mark.parametrize("tile,stages,teams,producers,ctas,head_tiles",
                         [(64, 3, 2, 2, 1, 1), (32, 5, 2, 2, 1, 2), (32, 3, 1, 2, 2, 1),
                          (32, 3, 1, 2, 2, 2), (64, 3, 1, 1, 1, 1), (32, 5, 2, 4, 1, 1), (32, 5, 2, 4, 1, 2)])
@pytest.mark.parametrize("splits", [1, 2, 4])
def test_sparse_mla_cuda_kernel_compiles_for_h200_without_spills(tile, stages, teams, producers, ctas, head_tiles, splits):
    source = (CSRC / "sparse_mla_decode.cu").read_text()
    defines = (("SPARSE_MLA_TILE", tile), ("SPARSE_MLA_STAGES", stages), ("SPARSE_MLA_HEAD_TILES", head_tiles),
               ("SPARSE_MLA_CTAS_PER_SM", ctas), ("SPARSE_MLA_PRODUCERS", producers), ("SPARSE_MLA_SPLITS", splits),
               ("SPARSE_MLA_TEAMS", teams))
    usage = resource_usage(compile_cubin(source, "sm_90", defines))
    # __launch_bounds__(threads, ctas): at most 65536 / (ctas * threads) registers a thread.
    assert usage["REG"] <= min(255, 65536 // (ctas * 32 * (4 * teams + producers)))
    assert usage["STACK"] == 0 and usage["LOCAL"] == 0


@pytest.mark.parametrize("splits", [1, 2, 8])
def test_sparse_mla_wgmma_kernel_compiles_for_sm90a_without_spills_or_serialized_mma(splits):
    cubin = compile_cubin((CSRC / "sparse_mla_wgmma.cu").read_text(), "sm_90a", (("SPARSE_MLA_SPLITS", splits),))
    usage = resource_usage(cubin)
    assert usage["REG"] <= 255 and usage["STACK"] == 0 and usage["LOCAL"] == 0
    sass = cuobjdump(cubin, "--dump-sass")
    # A tile's S^T by its owner: 32 latent k-steps (f16) and 4 rope k-steps (bf16); P.V by both
    # warpgroups, 4 token steps x 4 dim tiles (f16), at two places: the other's tile and its own.
    bf16 = sass.count("HGMMA.64x64x16.F32.BF16")
    assert bf16 == 4 and sass.count("HGMMA.64x64x16.F32") - bf16 == 32 + 2 * 16
    # ptxas serializes wgmmas it cannot keep in flight by a wait after each one; the kernel waits
    # 8 times for a tile's S^T (Horner's rule: after the rope, twice a group but the last) and 3
    # times in each P.V.
    assert sass.count("WARPGROUP.DEPBAR") <= 8 + 2 * 3


def test_sparse_mla_cuts_still_match_the_kernel_and_compile():
    """benchmarks/sparse_mla_cuts.py cuts parts out of the kernel's source by text: a cut that stopped
    matching would otherwise show only on a GPU, as a wrong table."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "sparse_mla_cuts.py"
    spec = importlib.util.spec_from_file_location("sparse_mla_cuts", path)
    cuts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cuts)
    source = (CSRC / cuts.SOURCE).read_text()
    for name, edits in cuts.CUTS.items():
        text = source
        for old, new in edits:
            assert old in text, f"cut {name!r}: {old!r} is no longer in {cuts.SOURCE}"
            text = text.replace(old, new)
        compile_cubin(text, "sm_90")


def test_sparse_mla_timeline_marks_still_match_the_kernels_and_compile():
    """benchmarks/sparse_mla_timeline.py marks each wgmma kernel's source by text anchors."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "sparse_mla_timeline.py"
    spec = importlib.util.spec_from_file_location("sparse_mla_timeline", path)
    timeline = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = timeline  # its dataclass looks its module up
    spec.loader.exec_module(timeline)
    for layout in timeline.LAYOUTS.values():
        marked = timeline.instrumented(layout, (CSRC / layout.source).read_text())
        # Every point, phase and tile mark once in the code.
        assert sorted(int(k) for k in re.findall(r"POINT\((\d+)\);", marked)) == list(range(len(layout.points)))
        assert sorted(int(k) for k in re.findall(r"PHASE\((\d+)\);", marked)) == list(range(len(layout.phases)))
        assert sorted(int(k) for k in re.findall(r"TILE\((\d+)\);", marked)) == [0, 1]
        cubin = compile_cubin(marked, "sm_90a", layout.defines)
        assert resource_usage(cubin)["LOCAL"] == 0
        # The script reads the marks by name (cuModuleGetGlobal): they must not be mangled.
        symbols = set(re.findall(r"\bg_\w+", cuobjdump(cubin, "-elf")))
        assert {"g_points", "g_tiles", "g_phases"} <= symbols


def test_compile_errors_carry_the_nvrtc_log():
    with pytest.raises(CudaError, match="undefined"):
        compile_cubin('extern "C" __global__ void k() { undefined_symbol(); }', "sm_90")


@pytest.mark.parametrize("row_batch,list_cap", [(2, 8192), (4, 8192), (4, 256)])
def test_radix_topk_cuda_kernel_compiles_for_h200_without_spills(row_batch, list_cap):
    defines = (("TOPK_ROW_BATCH", row_batch), ("TOPK_LIST_CAP", list_cap))
    usage = resource_usage(compile_cubin((CSRC / "radix_topk.cu").read_text(), "sm_90", defines))
    # __launch_bounds__(1024, 1): 64 registers a thread at most.
    assert usage["REG"] <= 64
    assert usage["STACK"] == 0 and usage["LOCAL"] == 0
