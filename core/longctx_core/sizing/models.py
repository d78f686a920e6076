"""Model presets: the architecture numbers the capacity planner needs, by name.

A preset is an `api.Architecture`, the same object a user may write out under
`spec.model.architecture`; `resolve_architecture` returns one or the other.

Where the numbers come from
---------------------------
* GLM-5.3 (`glm_moe_dsa`): 78 decoder layers + 1 MTP layer, 64 query heads,
  kv_lora_rank 512, qk_rope_head_dim 64, q_lora_rank 2048, hidden 6144,
  vocab 154,880, 256 routed experts (moe_intermediate 2048) + 1 shared,
  first 3 layers dense (intermediate 12288); DSA indexer with 32 heads x 128
  dims and top-k 2048 in 21 of the 78 layers (the other layers reuse an index
  group leader's top-k); the MTP layer carries MLA and an indexer.
  Sources: the reference deployment (docs/design.md#the-reference-deployment: 78 + 21 + MTP
  layers), docs/kernels.md#model-constants (64 heads, 32 index heads), a published GLM-5.3
  config.json (q_lora_rank, heads, kv_lora_rank, experts), and GLM-5-FP8's
  model card (hidden 6144, vocab 154,880, 78 layers, 3 dense, 753.9B params).
* DeepSeek-V3.2 (`deepseek_v32`, deepseek-ai/DeepSeek-V3.2 config.json):
  61 layers + 1 MTP layer (num_nextn_predict_layers), 128 heads,
  kv_lora_rank 512, qk_rope_head_dim 64, q_lora_rank 1536, hidden 7168,
  vocab 129,280, 256 experts (2048) + 1 shared, first 3 dense (18432);
  index_n_heads 64, index_head_dim 128, index_topk 2048, and every layer has
  its own indexer (DeepSeek-V3.2-Exp inference/model.py builds an Indexer in
  every MLA block).

Weight sizes (parameterBytes, replicatedParameterBytes)
-------------------------------------------------------
No published byte size of the GLM-5.3-FP8 checkpoint was available, so both
presets' sizes are *derived* from the geometry above by `_fp8_weight_bytes`:
every linear weight in FP8 (1 byte), embeddings and LM head in BF16; norms,
router gates and FP8 block scales (~0.5%) are left out. The derivation is
checked against published figures in tests/core/test_models.py: with an
indexer in every layer it gives 753.7B parameters for GLM-5 (model card:
753.9B), and 638 GiB for DeepSeek-V3.2 (its FP8 checkpoint is listed at
about 642 GiB / 685.4B parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx_core.api.model_types import Architecture, Model, PRESET_MTP_LAYERS
from longctx_core.api.schema import Quantity

# fp8_ds_mla: one FP8 byte per latent element, one fp32 scale per 128 elements, BF16 RoPE.
FP8_SCALE_GROUP = 128
FP32_BYTES = 4
BF16_BYTES = 2
FP8_BYTES = 1


@dataclass(frozen=True)
class _Geometry:
    """config.json numbers that size the weights (not part of the API)."""

    hidden: int
    q_lora_rank: int
    heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int
    dense_intermediate: int
    moe_intermediate: int
    routed_experts: int
    shared_experts: int
    layers: int
    dense_layers: int
    mtp_layers: int
    vocab: int
    index_heads: int
    index_head_dim: int
    # Layers that reuse an earlier layer's top-k build no indexer and keep no indexer keys:
    # vLLM 0.33 (model_executor/models/deepseek_v2.py) skips the indexer of main-model
    # layer l when max(l - offset + 1, 0) % freq != 0 (config.json's index_topk_freq and
    # index_skip_topk_offset); MTP layers always have one.
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 2

    @property
    def index_layers(self) -> int:
        return sum(max(layer - self.index_skip_topk_offset + 1, 0) % self.index_topk_freq == 0
                   for layer in range(self.layers))

    def parameters(self) -> tuple[int, int, int]:
        """(routed-expert params, other linear params, embedding + LM head params)."""
        h = self.hidden
        attention = (h * self.q_lora_rank
                     + self.q_lora_rank * self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
                     + h * (self.kv_lora_rank + self.qk_rope_head_dim)
                     + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
                     + self.heads * self.v_head_dim * h)
        indexer = (self.q_lora_rank * self.index_heads * self.index_head_dim
                   + h * self.index_head_dim + h * self.index_heads)
        moe_layers = self.layers - self.dense_layers + self.mtp_layers
        expert = 3 * h * self.moe_intermediate
        routed = self.routed_experts * expert * moe_layers
        other = (attention * (self.layers + self.mtp_layers)
                 + indexer * (self.index_layers + self.mtp_layers)
                 + self.shared_experts * expert * moe_layers
                 + 3 * h * self.dense_intermediate * self.dense_layers
                 + self.mtp_layers * 2 * h * h)  # MTP eh_proj
        embeddings = 2 * self.vocab * h  # embed_tokens + lm_head (untied)
        return routed, other, embeddings


def _fp8_weight_bytes(g: _Geometry) -> tuple[int, int]:
    """(all weight bytes, bytes that expert parallelism does not split), FP8 checkpoint."""
    routed, other, embeddings = g.parameters()
    replicated = other * FP8_BYTES + embeddings * BF16_BYTES
    return routed * FP8_BYTES + replicated, replicated


_GLM_5_3 = _Geometry(hidden=6144, q_lora_rank=2048, heads=64, qk_nope_head_dim=192,
                     qk_rope_head_dim=64, v_head_dim=256, kv_lora_rank=512,
                     dense_intermediate=12288, moe_intermediate=2048, routed_experts=256,
                     shared_experts=1, layers=78, dense_layers=3,
                     mtp_layers=PRESET_MTP_LAYERS["glm-5.3"], vocab=154880,
                     index_heads=32, index_head_dim=128, index_topk_freq=4,
                     index_skip_topk_offset=3)

_DEEPSEEK_V3_2 = _Geometry(hidden=7168, q_lora_rank=1536, heads=128, qk_nope_head_dim=128,
                           qk_rope_head_dim=64, v_head_dim=128, kv_lora_rank=512,
                           dense_intermediate=18432, moe_intermediate=2048, routed_experts=256,
                           shared_experts=1, layers=61, dense_layers=3,
                           mtp_layers=PRESET_MTP_LAYERS["deepseek-v3.2"], vocab=129280,
                           index_heads=64, index_head_dim=128)


def _preset(g: _Geometry, top_k: int) -> Architecture:
    total, replicated = _fp8_weight_bytes(g)
    return Architecture(
        layers=g.layers, mtpLayers=g.mtp_layers, attentionHeads=g.heads,
        kvLoraRank=g.kv_lora_rank, qkRopeHeadDim=g.qk_rope_head_dim,
        indexLayers=g.index_layers, indexHeads=g.index_heads, indexHeadDim=g.index_head_dim,
        indexTopK=top_k, parameterBytes=Quantity(str(total)),
        replicatedParameterBytes=Quantity(str(replicated)))


PRESETS: dict[str, Architecture] = {
    "glm-5.3": _preset(_GLM_5_3, top_k=2048),
    "deepseek-v3.2": _preset(_DEEPSEEK_V3_2, top_k=2048),
}


def resolve_architecture(model: Model) -> Architecture:
    """The architecture of spec.model: the explicit one, or the named preset."""
    if model.architecture is not None:
        return model.architecture
    if model.preset is None:
        raise ValueError("spec.model: set spec.model.preset (one of "
                         f"{', '.join(PRESETS)}) or spec.model.architecture")
    try:
        return PRESETS[model.preset]
    except KeyError:
        raise ValueError(f"spec.model.preset: unknown preset {model.preset!r}; "
                         f"known presets are {', '.join(PRESETS)}") from None


# ------------------------------------------------------------ byte formats


def _scale_bytes(dim: int) -> int:
    return -(-dim // FP8_SCALE_GROUP) * FP32_BYTES


def mla_row_bytes(arch: Architecture, kv_cache_dtype: str = "fp8") -> int:
    """KV bytes per token per MLA layer.

    fp8 / fp8_ds_mla (FlashMLA's layout): kvLoraRank FP8 + one fp32 scale per 128 +
    qkRopeHeadDim BF16 = 512 + 16 + 128 = 656. auto (BF16 on H200): (512 + 64) x 2 = 1152.
    """
    if kv_cache_dtype == "auto":
        return (arch.kvLoraRank + arch.qkRopeHeadDim) * BF16_BYTES
    return (arch.kvLoraRank * FP8_BYTES + _scale_bytes(arch.kvLoraRank)
            + arch.qkRopeHeadDim * BF16_BYTES)


def indexer_row_bytes(arch: Architecture) -> int:
    """Indexer key bytes per token per indexer layer: indexHeadDim FP8 + one fp32 scale per
    128 (DeepGEMM's head_dim_with_sf: 128 + 4 = 132). 0 for dense MLA."""
    if arch.indexHeadDim == 0:
        return 0
    return arch.indexHeadDim * FP8_BYTES + _scale_bytes(arch.indexHeadDim)
