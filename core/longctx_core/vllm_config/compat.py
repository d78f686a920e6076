"""Prefill/decode compatibility: the factors of vLLM's NIXL compatibility hash.

NIXL refuses a handshake between engines whose hash differs (docs/vllm.md#nixl-compatibility), but
only when the first request arrives, after both sides loaded the model. The operator
calls `pd_compatibility` on the two rendered commands (e.g. an old prefill pod and a new
decode pod during a rollout) and refuses to pair a mismatched set.

Compared: the --model string (hashed verbatim), the vLLM version, the KV cache dtype after
vLLM's canonicalisation (fp8 -> fp8_ds_mla for sparse MLA), a pinned attention backend,
the speculative method and draft (method, model, revision, parallel_drafting,
kv_cache_dtype), the hybrid KV cache manager (on for both), and the NIXL transfer mode
(pull vs push).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Optional

from longctx_core import contract
from longctx_core.plan.extra_args import Flag, parse_flags
from longctx_core.vllm_config.recipes import EngineCommand, canonical_kv_cache_dtype
from longctx_core.plan.revision import HANDSHAKE_FACTORS


# Legacy MTP method names vLLM rewrites to "mtp" (speculative.py:1246-1250).
_MTP_ALIASES = {"mtp", "deepseek_mtp", "glm4_moe_mtp", "glm_moe_dsa_mtp", "mimo_mtp",
                "ernie_mtp", "qwen3_next_mtp", "longcat_flash_mtp", "pangu_ultra_moe_mtp"}
# Connectors that support the hybrid KV cache manager (class-level SupportsHMA).
_HMA_CONNECTORS = {"NixlConnector", "NixlPullConnector", "NixlPushConnector",
                   "OffloadingConnector", "HiSparseConnector"}
_SPEC_HASH_KEYS = ("model", "revision", "parallel_drafting", "kv_cache_dtype")


def _flags(cmd: EngineCommand) -> tuple[Flag, ...]:
    return _parsed(tuple(cmd.argv[3:]))


# Each comparison reads a few flags of the same two commands.
@functools.lru_cache(maxsize=16)
def _parsed(args: tuple[str, ...]) -> tuple[Flag, ...]:
    return tuple(parse_flags(list(args)))


def _flag(cmd: EngineCommand, *names: str) -> Optional[str]:
    """Last value of a flag (by canonical name) in the command, or None."""
    value = None
    for a in _flags(cmd):
        if a.name in names:
            value = a.value
    return value


def _has(cmd: EngineCommand, spelled: set[str]) -> bool:
    return any(a.spelled in spelled for a in _flags(cmd))


def model_string(cmd: EngineCommand) -> str:
    return cmd.argv[2] if len(cmd.argv) > 2 else ""


def kv_cache_dtype(cmd: EngineCommand) -> str:
    return canonical_kv_cache_dtype(_flag(cmd, "kv-cache-dtype") or "auto")


def _json(value: Optional[str]) -> Any:
    if not value:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


def speculative(cmd: EngineCommand) -> Optional[dict[str, Any]]:
    cfg = _json(_flag(cmd, "speculative-config"))
    if not isinstance(cfg, dict):
        cfg = {}
    cfg = dict(cfg)
    for flag, key in (("spec-method", "method"), ("spec-model", "model")):
        v = _flag(cmd, flag)
        if v is not None:
            cfg[key] = v
    if not cfg.get("method") and not cfg.get("model"):
        return None
    method = cfg.get("method")
    if method in _MTP_ALIASES:
        cfg["method"] = "mtp"
    return cfg


def kv_transfer(cmd: EngineCommand) -> Optional[dict[str, Any]]:
    cfg = _json(_flag(cmd, "kv-transfer-config"))
    return cfg if isinstance(cfg, dict) else None


def _connectors(cfg: Optional[dict]) -> list[dict]:
    if not cfg:
        return []
    if cfg.get("kv_connector") == "MultiConnector":
        return list((cfg.get("kv_connector_extra_config") or {}).get("connectors") or [])
    return [cfg]


def hma_problem(cmd: EngineCommand) -> Optional[str]:
    """Why the hybrid KV cache manager would be off for this command (None when on)."""
    if _has(cmd, {"disable-hybrid-kv-cache-manager", "no-enable-hybrid-kv-cache-manager"}):
        return "--disable-hybrid-kv-cache-manager is set"
    cfg = kv_transfer(cmd)
    if cfg and cfg.get("kv_connector") == "MultiConnector" and not _connectors(cfg):
        return "its MultiConnector has no connectors list"
    lacking = [c.get("kv_connector") for c in _connectors(cfg)
               if c.get("kv_connector") not in _HMA_CONNECTORS]
    if lacking:
        return f"connector(s) {', '.join(map(str, lacking))} do not support it"
    return None


def nixl_connector(cmd: EngineCommand) -> Optional[dict]:
    for c in _connectors(kv_transfer(cmd)):
        if str(c.get("kv_connector", "")).startswith("Nixl"):
            return c
    return None


def _mode(nixl: Optional[dict]) -> Optional[str]:
    if nixl is None:
        return None
    return "push" if nixl.get("kv_connector") == "NixlPushConnector" else "pull"


# How each of revision.HANDSHAKE_FACTORS reads on a rendered command.
_ON_COMMAND: dict[str, Callable[[EngineCommand], Any]] = {
    "model": model_string,
    "vllm": lambda cmd: cmd.env.get(contract.ENV_VLLM_VERSION),
    "kvCacheDtype": kv_cache_dtype,
    "speculative": lambda cmd: (speculative(cmd) or {}).get("method"),
}


def pd_compatibility(prefill_cmd: EngineCommand, decode_cmd: EngineCommand) -> list[str]:
    """Mismatches that would fail the NIXL handshake (empty list = compatible)."""
    p, d = prefill_cmd, decode_cmd
    out = []

    def cmp(what: str, pv: Any, dv: Any, fix: str) -> None:
        if pv != dv:
            out.append(f"{what} differs: prefill {pv!r}, decode {dv!r}; {fix}")

    ps, ds = speculative(p), speculative(d)
    for factor in HANDSHAKE_FACTORS:
        if factor.key == "speculative" and (ps is None) != (ds is None):
            out.append(f"speculative decoding is {'on' if ps else 'off'} on prefill and "
                       f"{'on' if ds else 'off'} on decode; the NIXL hash includes it, so "
                       "prefill must run the same method (spec.engine.speculative)")
            continue
        read = _ON_COMMAND[factor.key]
        cmp(factor.what, read(p), read(d), factor.fix)
    cmp("--attention-backend", _flag(p, "attention-backend"), _flag(d, "attention-backend"),
        "pin the same backend on both roles or on neither")
    if ps and ds:
        for key in _SPEC_HASH_KEYS:
            cmp(f"speculative {key}", ps.get(key), ds.get(key),
                "the draft must be identical on both roles")
    for role, cmd in (("prefill", p), ("decode", d)):
        why = hma_problem(cmd)
        if why:
            out.append(f"hybrid KV cache manager is off on {role} ({why}); it must be on for "
                       "both roles (decode HiSparse requires it and NIXL hashes it)")
    pn, dn = nixl_connector(p), nixl_connector(d)
    for role, n in (("prefill", pn), ("decode", dn)):
        if n is None:
            out.append(f"{role} has no NIXL connector in --kv-transfer-config")
    if pn and dn:
        cmp("NIXL transfer mode", _mode(pn), _mode(dn), "use the same NIXL connector class")
        if pn.get("kv_role") not in ("kv_producer", "kv_both"):
            out.append(f"prefill NIXL kv_role is {pn.get('kv_role')!r}; it must be kv_producer")
        if dn.get("kv_role") not in ("kv_consumer", "kv_both"):
            out.append(f"decode NIXL kv_role is {dn.get('kv_role')!r}; it must be kv_consumer")
    return out
