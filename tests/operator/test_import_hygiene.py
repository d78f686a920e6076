"""The operator path must not load vLLM or torch (its image has neither)."""

import subprocess
import sys


def test_operator_imports_neither_vllm_nor_torch():
    code = ("import sys, longctx_operator.runtime.main, longctx_operator.cli, longctx_operator.controller.reconcile; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', "
            "'triton')); print(heavy); assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
