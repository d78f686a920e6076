"""spec.model: the model served, its architecture (or preset) and where its weights come from,
and spec.engine.speculative, which the model's MTP layers bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from longctx_core.api.fields import argv_name_rule
from longctx_core.api.schema import APIObject, Quantity, Rule, api_field

# MTP draft layers of each preset (models.PRESETS reads them from here), so that the
# CEL rules about MTP can tell a preset's layers without the planner.
PRESET_MTP_LAYERS = {"glm-5.3": 1, "deepseek-v3.2": 1}
PRESET_NAMES = tuple(PRESET_MTP_LAYERS)
PRESET_MTP_MAP = "{" + ", ".join(f"'{k}': {v}" for k, v in PRESET_MTP_LAYERS.items()) + "}"


@dataclass(frozen=True, kw_only=True)
class Architecture(APIObject):
    """Model architecture numbers the capacity planner needs (a preset is the same object, named)."""

    layers: int = api_field("Attention (MLA) layers of the main model.", minimum=1)
    mtpLayers: int = api_field("MTP draft layers; each carries MLA KV and indexer keys.", 0, minimum=0)
    attentionHeads: int = api_field("Query heads per attention layer.", minimum=1)
    kvLoraRank: int = api_field("MLA latent (compressed KV) dimension, e.g. 512.", minimum=1)
    qkRopeHeadDim: int = api_field("Decoupled RoPE key dimension, e.g. 64.", minimum=0)
    indexLayers: int = api_field("Layers with a sparse-attention indexer (DSA); 0 for dense MLA.", 0,
                                 minimum=0)
    indexHeads: int = api_field("Indexer query heads.", 0, minimum=0)
    indexHeadDim: int = api_field("Indexer key dimension.", 0, minimum=0)
    indexTopK: int = api_field("Keys each query attends to under sparse attention (top-k).", 0,
                               minimum=0)
    parameterBytes: Optional[Quantity] = api_field(
        "Bytes of all weights as served (e.g. FP8); the planner subtracts each GPU's share "
        "from its memory to estimate the KV budget. Without it, set "
        "spec.capacity.kvBudgetPerGpu.", None)
    replicatedParameterBytes: Optional[Quantity] = api_field(
        "Bytes of the weights that expert parallelism does not split (attention and indexer "
        "projections, dense and shared-expert MLPs, embeddings, LM head): every GPU holds "
        "them, divided only by tensorParallel. The rest of parameterBytes is split across the "
        "expert-parallel group. Without it the planner divides all of parameterBytes by the "
        "expert-parallel group, which overestimates the KV budget.", None)


@dataclass(frozen=True, kw_only=True)
class SecretKeyRef(APIObject):
    """A key of a Secret in the CR's namespace."""

    name: str = api_field("Secret name.", max_length=253)
    key: str = api_field("Key inside the Secret.", "HF_TOKEN")


@dataclass(frozen=True, kw_only=True)
class PVCSource(APIObject):
    """Weights on a PersistentVolumeClaim (read-only)."""

    claimName: str = api_field("PersistentVolumeClaim name in the CR's namespace.", max_length=253)
    subPath: str = api_field("Directory inside the claim that holds the model.", "")


@dataclass(frozen=True, kw_only=True)
class HuggingFaceSource(APIObject):
    """Weights downloaded from Hugging Face at start-up."""

    tokenSecretRef: Optional[SecretKeyRef] = api_field(
        "Secret key with the Hugging Face token (for gated models).", None)


@dataclass(frozen=True, kw_only=True)
class ModelSource(APIObject):
    """Where the engine finds the weights: exactly one of pvc and huggingFace."""

    CEL = (Rule("has(self.pvc) != has(self.huggingFace)",
                "set exactly one of spec.model.source.pvc and spec.model.source.huggingFace"),)
    pvc: Optional[PVCSource] = api_field("Weights on a PVC mounted read-only at /models.", None)
    huggingFace: Optional[HuggingFaceSource] = api_field("Weights fetched from Hugging Face.", None)


@dataclass(frozen=True, kw_only=True)
class Model(APIObject):
    """The model served, identical on prefill and decode."""

    CEL = (Rule("has(self.preset) != has(self.architecture)",
                "set exactly one of spec.model.preset (glm-5.3, deepseek-v3.2) and "
                "spec.model.architecture"),)
    name: str = api_field(
        "The --model string (repo id or path). Prefill and decode use it verbatim. Part of "
        "the revision (the NIXL handshake hashes it): a change starts a revisioned rollout "
        "(spec.rollout), so old and new pods never pair.",
        max_length=253, rules=(argv_name_rule("name", "--model"),))
    servedName: Optional[str] = api_field(
        "Name clients use (--served-model-name).", None, max_length=253,
        rules=(argv_name_rule("servedName", "--served-model-name"),))
    preset: Optional[str] = api_field("A known architecture.", None, enum=PRESET_NAMES)
    architecture: Optional[Architecture] = api_field("Explicit architecture numbers.", None)
    source: ModelSource = api_field("Where the weights come from.")


@dataclass(frozen=True, kw_only=True)
class Speculative(APIObject):
    """Speculative decoding; prefill runs it too because NIXL compares it."""

    CEL = (Rule("self.method == 'none' || self.draftTokens >= 1",
                "draftTokens is {self.draftTokens}; it must be at least 1 when method is mtp "
                "(or set method to none)"),)
    method: str = api_field(
        "mtp (multi-token prediction) or none. Part of the revision (the NIXL handshake "
        "compares it): a change starts a revisioned rollout (spec.rollout).", "mtp",
        enum=("mtp", "none"))
    draftTokens: int = api_field("Draft tokens per step (num_speculative_tokens).", 3,
                                 minimum=0, maximum=8)
