"""The revision of a spec: what a prefill/decode pair must share, as a short digest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import contract
from .extra_args import parse_flags

# extraArgs flags that change what the NIXL handshake compares or how KV is laid out.
PAIRING_FLAGS = ("attention-backend", "block-size")


def pairing_key(spec: Any) -> str:
    """The revision of a spec: a digest of everything a prefill/decode pair must share for
    the NIXL handshake and the KV layout. The model, the image (so the vLLM build), the vLLM
    version, the KV dtype, the speculative method, and any extraArgs that pin the attention
    backend or the KV block size. Serving pods carry it as a label and the InferencePool
    selects on it, so a rollout never pairs engines of different revisions; a change that
    keeps it rolls in place."""
    flags = {role: sorted((f.name, f.value or "") for f in parse_flags(
        list(getattr(spec.engine.extraArgs, role))) if f.name in PAIRING_FLAGS)
        for role in contract.ROLES}
    factors = {"model": spec.model.name, "image": spec.engine.image,
               "vllm": spec.engine.vllmVersion, "kvCacheDtype": spec.engine.kvCacheDtype,
               "speculative": spec.engine.speculative.method, "flags": flags}
    digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()
    return digest[:contract.REVISION_LENGTH]
