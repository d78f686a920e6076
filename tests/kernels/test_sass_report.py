"""benchmarks/sass_report.py compiles the sparse-MLA kernel for sm_90 on this CPU-only host (Triton
bundles ptxas and cuobjdump) and reads the SASS: the reasons behind its tuning stay checkable."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def report(*flags: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, don't interpret
    env["PYTHONPATH"] = str(ROOT / "kernels")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass_report.py"), *flags], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return dict(
        registers=int(re.search(r"registers (\d+)/thread", out).group(1)),
        spill=int(re.search(r"spill stack (\d+) B", out).group(1)),
        loop=int(re.search(r"k-tile loop: (\d+) instructions", out).group(1)),
        mix=out.splitlines()[-1],
    )


def test_fp16_operands_shorten_the_loop_of_the_few_head_config():
    config = ("--block-h", "16", "--block-k", "16", "--warps", "4", "--stages", "2", "--prefetch")
    bf16, fp16 = report(*config), report(*config, "--fp16")
    assert bf16["spill"] == 0 and fp16["spill"] == 0
    assert bf16["registers"] <= 255 and bf16["loop"] > 0
    # e4m3 -> bf16 goes through fp16 and fp32 (F2F); e4m3 -> fp16 is one F2FP per pair.
    assert "F2F " in bf16["mix"] and "F2F " not in fp16["mix"]
    assert fp16["loop"] < bf16["loop"]
