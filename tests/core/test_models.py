"""Model presets: the architecture numbers and the byte formats derived from them."""

from __future__ import annotations

import pytest

from longctx_core.api import model_types as api_model, spec as api
from longctx_core.sizing import models
from longctx_core.quantity import GiB, parse_bytes


@pytest.mark.parametrize("name, layers, mtp, heads, index_layers, index_heads", [
    ("glm-5.3", 78, 1, 64, 21, 32),
    ("deepseek-v3.2", 61, 1, 128, 61, 64),
])
def test_presets_are_architectures(name, layers, mtp, heads, index_layers, index_heads):
    arch = models.PRESETS[name]
    assert isinstance(arch, api_model.Architecture)
    assert (arch.layers, arch.mtpLayers, arch.attentionHeads) == (layers, mtp, heads)
    assert (arch.kvLoraRank, arch.qkRopeHeadDim) == (512, 64)
    assert (arch.indexLayers, arch.indexHeads, arch.indexHeadDim, arch.indexTopK) == \
        (index_layers, index_heads, 128, 2048)


def test_every_preset_name_of_the_api_resolves():
    assert set(models.PRESETS) == set(api_model.PRESET_NAMES)


@pytest.mark.parametrize("dtype, row", [("fp8", 656), ("fp8_ds_mla", 656), ("auto", 1152)])
def test_mla_row_is_derived_from_the_architecture(dtype, row):
    arch = models.PRESETS["glm-5.3"]
    assert models.mla_row_bytes(arch, dtype) == row
    # A different latent changes the row: 256 fp8 + 2 scales x 4 + 64 x 2.
    other = api_model.Architecture(layers=1, attentionHeads=8, kvLoraRank=256, qkRopeHeadDim=64)
    assert models.mla_row_bytes(other, "fp8") == 256 + 8 + 128


def test_indexer_row_is_derived_from_the_architecture():
    assert models.indexer_row_bytes(models.PRESETS["glm-5.3"]) == 132
    dense = api_model.Architecture(layers=1, attentionHeads=8, kvLoraRank=512, qkRopeHeadDim=64)
    assert models.indexer_row_bytes(dense) == 0


def test_weight_derivation_reproduces_published_sizes():
    # GLM-5 (same geometry as GLM-5.3 but an indexer in every layer): 753.9B parameters.
    glm5 = models._Geometry(**{**models._GLM_5_3.__dict__, "index_topk_freq": 1})
    assert sum(glm5.parameters()) == pytest.approx(753.9e9, rel=0.005)
    # DeepSeek-V3.2's FP8 checkpoint: about 642 GiB (685.4B parameters incl. MTP).
    total, _ = models._fp8_weight_bytes(models._DEEPSEEK_V3_2)
    assert total / GiB == pytest.approx(642, rel=0.01)


@pytest.mark.parametrize("name", ["glm-5.3", "deepseek-v3.2"])
def test_presets_carry_weight_bytes(name):
    arch = models.PRESETS[name]
    total = parse_bytes(arch.parameterBytes)
    replicated = parse_bytes(arch.replicatedParameterBytes)
    assert 600 * GiB < total < 720 * GiB
    assert 15 * GiB < replicated < 25 * GiB


def test_resolve_architecture_preset_and_explicit():
    spec = api.load_spec({"model": {"name": "m", "preset": "glm-5.3",
                                    "source": {"pvc": {"claimName": "c"}}},
                          "maxContextTokens": 1024})
    assert models.resolve_architecture(spec.model) is models.PRESETS["glm-5.3"]
    explicit = {"layers": 4, "attentionHeads": 16, "kvLoraRank": 512, "qkRopeHeadDim": 64}
    spec = api.load_spec({"model": {"name": "m", "architecture": explicit,
                                    "source": {"pvc": {"claimName": "c"}}},
                          "maxContextTokens": 1024})
    assert models.resolve_architecture(spec.model).layers == 4


def test_resolve_architecture_unknown_preset_names_the_field():
    model = api_model.Model(name="m", preset="nope", source=api_model.ModelSource(pvc=api_model.PVCSource(claimName="c")))
    with pytest.raises(ValueError, match="spec.model.preset"):
        models.resolve_architecture(model)


def test_indexer_layers_follow_vllms_skip_rule_and_the_checkpoints_indexer_types():
    """GLM-5.3's config.json marks layers 0, 1, 2, 6, 10, ..., 74 "full" (their own top-k)
    and the other 57 "shared"; vLLM builds an indexer, and keeps indexer keys, only for the
    full ones. DeepSeek-V3.2 has an indexer on every layer."""
    full = [0, 1, 2, *range(6, 78, 4)]
    assert len(full) == 21
    glm = models._GLM_5_3
    assert [l for l in range(glm.layers) if max(l - glm.index_skip_topk_offset + 1, 0)
            % glm.index_topk_freq == 0] == full
    assert models.PRESETS["glm-5.3"].indexLayers == 21
    assert models.PRESETS["deepseek-v3.2"].indexLayers == 61
