"""The performance model beside NVIDIA's aiconfigurator (an optional extra; never on the
operator's path): KV bytes per token of GLM-5.3, and the prefill time of a layout both
model, TP8 x EP8 on one H200 node (no context parallelism, which aiconfigurator does not
model for vLLM).

    pip install aiconfigurator==0.12.0     # Apache-2.0; its own environment is fine
    PYTHONPATH=engine python benchmarks/aiconfigurator_crosscheck.py

aiconfigurator prices kernels from its measured tables (h200_sxm; its vLLM tables for this
model fall back to TensorRT-LLM rows, which it says); this project's model prices them by
roofline at measured efficiencies (docs/performance.md). Prints one table of both.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import yaml

from longctx_core.api import spec as api
from longctx_core.sizing import cost_terms, hardware, models, performance, phase_timing, planner

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "glm-5.3-1m.yaml"
HF_MODEL = "zai-org/GLM-5.3-FP8"   # its bundled config: 78 layers, 21 "full" indexer layers
PROMPTS = (8192, 32768, 65536, 131072)


def ours_kv_bytes(spec: api.LongContextDeploymentSpec) -> dict[str, int]:
    arch = models.resolve_architecture(spec.model)
    row, index = models.mla_row_bytes(arch, "fp8"), models.indexer_row_bytes(arch)
    layers, index_layers = arch.layers + arch.mtpLayers, arch.indexLayers + arch.mtpLayers
    return {"total": layers * row + index_layers * index, "layers": layers,
            "index_layers": index_layers, "row": row, "index_row": index}


def theirs_kv_bytes() -> float:
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.config import ModelConfig
    model = get_model(HF_MODEL, ModelConfig(tp_size=8, moe_ep_size=8), "vllm")
    return model.get_kvcache_bytes_per_sequence(1)


def theirs_prefill(prompt: int, backend: str) -> tuple[float, dict[str, float]]:
    """Prefill seconds of one prompt, and seconds by their op (context_attention, ...)."""
    from aiconfigurator.cli.api import cli_estimate
    result = cli_estimate(HF_MODEL, "h200_sxm", mode="static_ctx", backend_name=backend,
                          isl=prompt, osl=1, batch_size=1, tp_size=8, moe_ep_size=8)
    ops = {k: v / 1e3 for k, v in result.summary.get_context_latency_dict().items()}
    return result.ttft / 1e3, ops


# Their ops and our terms that price the same work (the rest is projections, norms and
# the TP all-reduce, which they fold into other ops).
SAME_WORK = {"attention (sparse MLA, indexer, top-k)": (
                 ("context_attention",), ("sparseMla", "indexer", "indexerTopK")),
             "routed experts and their dispatch": (
                 ("context_moe", "context_moe_pre_dispatch", "context_moe_post_dispatch"),
                 ("experts", "epAllToAll"))}


def main() -> int:
    try:
        import aiconfigurator  # noqa: F401
    except ImportError:
        print("aiconfigurator is not installed: pip install aiconfigurator==0.12.0",
              file=sys.stderr)
        return 2
    spec = api.load_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    hw = hardware.H200
    tp8 = dict(performance.alternatives(spec))["TP8 prefill"]
    layout, _ = planner.role_layouts(tp8)
    shape = cost_terms.model_shape(tp8)

    ours = ours_kv_bytes(spec)
    theirs = theirs_kv_bytes()
    print("| figure | this project | aiconfigurator | difference |\n| --- | --- | --- | --- |")
    print(f"| KV bytes a token, GLM-5.3, FP8 cache | {ours['total']:,} | {theirs:,.0f} | "
          f"{100 * (theirs / ours['total'] - 1):+.0f}% |")
    for prompt in PROMPTS:
        costs = phase_timing.prefill(shape, layout, hw, prompt)
        for backend in ("vllm", "sglang"):
            other, ops = theirs_prefill(prompt, backend)
            rows = [(f"TP8 x EP8 prefill, {prompt // 1024}K prompt, from scratch (s)",
                     costs.seconds, other)]
            if prompt == 65536:
                rows += [(f"  of which {name} (s)", sum(costs.terms.get(t, 0) for t in ours),
                          sum(ops.get(o, 0) for o in theirs))
                         for name, (theirs, ours) in SAME_WORK.items()]
            for figure, mine, their in rows:
                print(f"| {figure}; theirs: {backend} tables | {mine:.2f} | {their:.2f} | "
                      f"{100 * (their / mine - 1):+.0f}% |")
    print(f"\nthis project: {ours['layers']} MLA layers (main + MTP) x {ours['row']} B "
          f"(fp8_ds_mla: 512 e4m3 + 4 fp32 scales + 64 bf16) + {ours['index_layers']} indexer "
          f"layers x {ours['index_row']} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
