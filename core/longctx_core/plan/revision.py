"""The revision of a spec: what a prefill/decode pair must share, as a short digest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dataclasses import dataclass
from typing import Callable

from longctx_core import contract
from longctx_core.plan.extra_args import parse_flags


@dataclass(frozen=True)
class HandshakeFactor:
    """One value vLLM's NIXL handshake compares between a prefill and a decode engine: the
    pairing key hashes it from the spec, compat.pd_compatibility compares it on the two
    rendered commands (`what` names it there, `fix` says how to align it)."""

    key: str
    what: str
    fix: str
    of_spec: Callable[[Any], Any]
    field: str                  # the spec field it comes from


HANDSHAKE_FACTORS = (
    HandshakeFactor("model", "--model string",
                    "NIXL hashes it verbatim: use the identical repo id or path on both roles",
                    lambda spec: spec.model.name, "spec.model.name"),
    HandshakeFactor("vllm", "vLLM version",
                    "run the same engine image (spec.engine.vllmVersion) on both roles",
                    lambda spec: spec.engine.vllmVersion, "spec.engine.vllmVersion"),
    HandshakeFactor("kvCacheDtype", "KV cache dtype",
                    "both roles must use the same spec.engine.kvCacheDtype",
                    lambda spec: spec.engine.kvCacheDtype, "spec.engine.kvCacheDtype"),
    HandshakeFactor("speculative", "speculative method",
                    "use the same spec.engine.speculative.method",
                    lambda spec: spec.engine.speculative.method,
                    "spec.engine.speculative.method"),
)
# extraArgs flags that change what the NIXL handshake compares or how KV is laid out.
PAIRING_FLAGS = ("attention-backend", "block-size")
# The spec fields of the factors pairing_key hashes besides HANDSHAKE_FACTORS.
_OTHER_FIELDS = {"image": "spec.engine.image",
                 "flags": "spec.engine.extraArgs (" + ", ".join(f"--{f}" for f in PAIRING_FLAGS)
                 + ")"}


def _factors(spec: Any) -> dict[str, Any]:
    flags = {role: sorted((f.name, f.value or "") for f in parse_flags(
        list(getattr(spec.engine.extraArgs, role))) if f.name in PAIRING_FLAGS)
        for role in contract.ROLES}
    factors = {f.key: f.of_spec(spec) for f in HANDSHAKE_FACTORS}
    factors.update(image=spec.engine.image, flags=flags)
    return factors


def pairing_fields() -> list[str]:
    """The spec fields the pairing key is made of: a change of any rolls both roles."""
    return [f.field for f in HANDSHAKE_FACTORS] + list(_OTHER_FIELDS.values())


def pairing_changes(old: Any, new: Any) -> list[str]:
    """The spec fields of the pairing key whose values differ between two specs."""
    fields = {**{f.key: f.field for f in HANDSHAKE_FACTORS}, **_OTHER_FIELDS}
    before, after = _factors(old), _factors(new)
    return [fields[k] for k in before if before[k] != after[k]]


def pairing_key(spec: Any) -> str:
    """The revision of a spec: a digest of everything a prefill/decode pair must share for
    the NIXL handshake (HANDSHAKE_FACTORS) and the KV layout: those, the image (so the vLLM
    build), and any extraArgs that pin the attention backend or the KV block size
    (`pairing_fields`). Serving pods carry it as a label and the router selects on it, so a
    rollout never pairs engines of different revisions; a change that keeps it replaces
    only the roles whose pods change (controller/replacement.py), a change of it both."""
    digest = hashlib.sha256(json.dumps(_factors(spec), sort_keys=True).encode()).hexdigest()
    return digest[:contract.REVISION_LENGTH]
