"""`spec.engine.extraArgs`: the flags a user may add to `vllm serve`, and the ones refused.

Flags the recipe sets itself are refused with the spec field that controls them, and so
are flags vLLM 0.33 accepts but that break the deployment without an error (see
docs/vllm.md#extra-arguments). Pure; no vLLM import.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.sizing.layout import role_layout
from longctx_core.sizing.memory import hisparse_enabled

# Flags the recipes set, with the spec field that controls them. Keys are canonical long
# names without the leading "--". Short aliases are mapped to these by _ALIASES.
MANAGED_FLAGS: dict[str, str] = {
    "model": "spec.model.name",
    "model-tag": "spec.model.name",
    "served-model-name": "spec.model.servedName",
    "port": "the recipe (the role's engine base port + local rank; not configurable)",
    "tensor-parallel-size": "spec.{role}.tensorParallel",
    "pipeline-parallel-size": "spec.{role}.pipelineParallel",
    "prefill-context-parallel-size": "spec.{role}.contextParallel.prefill",
    "decode-context-parallel-size": "spec.{role}.contextParallel.decode",
    "dcp-comm-backend": "spec.{role}.contextParallel.commBackend",
    "data-parallel-size": "spec.{role}.dataParallel",
    "data-parallel-size-local": "spec.{role}.gpusPerPod (ranks per pod)",
    "data-parallel-rank": "the pod's StatefulSet ordinal",
    "data-parallel-start-rank": "the pod's StatefulSet ordinal",
    "data-parallel-address": "the group's pod 0 (headless Service DNS name)",
    "data-parallel-rpc-port": "the recipe",
    "data-parallel-backend": "the recipe (mp)",
    "data-parallel-multi-port-external-lb": "the recipe (one HTTP port per rank)",
    "data-parallel-external-lb": "the recipe (one HTTP port per rank)",
    "data-parallel-hybrid-lb": "the recipe (one HTTP port per rank)",
    "data-parallel-supervisor-port": "the recipe (HTTP base port + ranks per pod)",
    "api-server-count": "the recipe (one API server per rank)",
    "headless": "the recipe (every pod serves HTTP)",
    "nnodes": "spec.{role}.dataParallel and gpusPerPod",
    "node-rank": "the pod's StatefulSet ordinal",
    "master-addr": "the group's pod 0",
    "enable-expert-parallel": "spec.{role}.expertParallel",
    "attention-config": "the recipe (prefill: sparse_mla_force_mqa; decode: "
                        "spec.decode.hiSparse.deviceBufferSize)",
    "kv-cache-dtype": "spec.engine.kvCacheDtype",
    "max-model-len": "spec.maxContextTokens",
    "speculative-config": "spec.engine.speculative",
    "spec-method": "spec.engine.speculative.method",
    "spec-model": "spec.engine.speculative",
    "spec-tokens": "spec.engine.speculative.draftTokens",
    "kv-transfer-config": "spec.kvTransfer, spec.{role}.cpuOffloadPerRank and "
                          "spec.decode.hiSparse",
}

_ALIASES = {
    "tp": "tensor-parallel-size", "pp": "pipeline-parallel-size",
    "pcp": "prefill-context-parallel-size", "dcp": "decode-context-parallel-size",
    "dp": "data-parallel-size", "dpn": "data-parallel-rank", "dpr": "data-parallel-start-rank",
    "dpl": "data-parallel-size-local", "dpa": "data-parallel-address",
    "dpp": "data-parallel-rpc-port", "dpb": "data-parallel-backend",
    "dph": "data-parallel-hybrid-lb", "dpe": "data-parallel-external-lb",
    "dpm": "data-parallel-multi-port-external-lb", "ep": "enable-expert-parallel",
    "ac": "attention-config", "sc": "speculative-config", "asc": "api-server-count",
    "n": "nnodes", "r": "node-rank", "cc": "compilation-config", "q": "quantization",
    "disable-expert-parallel": "enable-expert-parallel",
}

_DISABLE_HMA = {"disable-hybrid-kv-cache-manager", "no-enable-hybrid-kv-cache-manager"}
# Flags vLLM 0.33 accumulates when repeated (argparse "append"); any other flag given twice
# keeps only its last value, silently. A contract test compares this with vLLM's parser.
REPEATABLE_FLAGS = frozenset({"middleware"})
# One argv item that is a flag: `--name`, `-n` or `--name=value` (a value may hold anything
# printable; a name may not hold spaces, or the item is two words in one).
_FLAG_ITEM = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_.-]*(=.*)?$", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Flag:
    index: int
    raw: str
    name: str               # canonical: long name without "--", '_' -> '-', alias resolved
    spelled: str            # as written, without value, '_' -> '-' (keeps no-/disable-)
    value: Optional[str]    # "=value" or the following token when it is not a flag


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not re.match(r"^-\d", token) and token != "-"


def parse_flags(args: list[str]) -> list[Flag]:
    """The flags in an argv fragment, with `--flag=value`, `_`/`-`, dotted keys
    (`--attention-config.x`) and short aliases normalised."""
    out = []
    for i, token in enumerate(args):
        if not _is_flag(token):
            continue
        head, eq, value = token.partition("=")
        body = head.lstrip("-")
        base = body.split(".", 1)[0].replace("_", "-")
        spelled = base
        name = _ALIASES.get(base, base)
        if name.startswith("no-"):
            name = _ALIASES.get(name[3:], name[3:])
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            value = nxt if nxt is not None and not _is_flag(nxt) else None
        out.append(Flag(i, token, name, spelled, value if (eq or value is not None) else None))
    return out


def _cudagraph_full(arg: Flag) -> bool:
    if arg.name != "compilation-config":
        return False
    raw_key = arg.raw.partition("=")[0]
    if "." in raw_key:      # -cc.cudagraph_mode=FULL
        return (raw_key.split(".", 1)[1].replace("-", "_") == "cudagraph_mode"
                and (arg.value or "").strip().strip("'\"") == "FULL")
    try:
        cfg = json.loads(arg.value or "")
    except ValueError:
        return False
    return isinstance(cfg, dict) and cfg.get("cudagraph_mode") == "FULL"


def extra_args_problems(spec: LongContextDeploymentSpec, role: str) -> list[str]:
    """What is wrong with spec.engine.extraArgs.<role> (empty when nothing)."""
    args = list(getattr(spec.engine.extraArgs, role))
    lay = role_layout(spec, role)
    cp = lay.prefillContextParallel > 1 or lay.decodeContextParallel > 1
    mtp = spec.engine.speculative.method == "mtp"
    hisparse = hisparse_enabled(spec, role)
    problems = _argv_item_problems(args, role)
    for a in parse_flags(args):
        where = f"spec.engine.extraArgs.{role}[{a.index}] ({a.raw!r})"
        if a.name in ("kv-offloading-size", "kv-offloading-backend"):
            problems.append(
                f"{where}: --{a.name} replaces the NIXL KV connector without an error, so "
                f"decode would never receive KV; remove it and size the CPU offload with "
                f"spec.{role}.cpuOffloadPerRank (the recipe adds an OffloadingConnector to the "
                "MultiConnector)")
        elif a.name in MANAGED_FLAGS:
            hint = MANAGED_FLAGS[a.name].format(role=role)
            problems.append(f"{where}: --{a.name} is set by the recipe from {hint}; remove it "
                            "from extraArgs" + ("" if hint.startswith("the ") else
                                                f" and set {hint.split(' ')[0]} instead"))
        elif a.spelled in _DISABLE_HMA:
            problems.append(
                f"{where}: the hybrid KV cache manager must stay on for both roles (it is part "
                "of the NIXL compatibility hash, and HiSparse requires it); remove the flag")
        elif a.name in ("enable-dbo", "ubatch-size") and (mtp or cp or hisparse):
            problems.append(
                f"{where}: dual batch overlap is rejected by vLLM with MTP, context parallelism "
                "or HiSparse (Model Runner V2); remove it")
        elif a.spelled == "no-scheduler-reserve-full-isl" and hisparse:
            problems.append(f"{where}: HiSparse requires --scheduler-reserve-full-isl; remove "
                            "the flag or set spec.decode.hiSparse.enabled to false")
        elif a.name == "enable-return-routed-experts" and cp:
            problems.append(f"{where}: routed-expert return is incompatible with context "
                            "parallelism (DCP/PCP > 1); remove it")
        elif _cudagraph_full(a) and (hisparse or lay.prefillContextParallel > 1):
            problems.append(
                f"{where}: cudagraph_mode=FULL is rejected with "
                f"{'HiSparse' if hisparse else 'prefill context parallelism'}; use "
                "FULL_AND_PIECEWISE (the default) or FULL_DECODE_ONLY")
    return problems


def _argv_item_problems(args: list[str], role: str) -> list[str]:
    """Items that are not one argv word each: control characters (a NUL cannot even be
    passed to exec), a flag and its value written as one item with a space, and a flag
    given twice (vLLM keeps the last silently)."""
    problems, seen = [], {}
    for i, item in enumerate(args):
        where = f"spec.engine.extraArgs.{role}[{i}] ({item!r})"
        if _CONTROL.search(item):
            problems.append(f"{where} contains a control character; each item is one argv "
                            "word: remove it")
        elif _is_flag(item) and not _FLAG_ITEM.match(item):
            problems.append(f"{where} is not one flag: write the flag and its value as two "
                            "items, or as --flag=value")
    for a in parse_flags(args):
        key = a.raw.partition("=")[0].lstrip("-").replace("_", "-")
        key = ".".join([a.name, *key.split(".")[1:]])
        if key in seen and a.name not in REPEATABLE_FLAGS:
            problems.append(f"spec.engine.extraArgs.{role}[{a.index}] ({a.raw!r}) repeats "
                            f"--{key} of item {seen[key]}; vLLM would keep only the last "
                            "value: keep one")
        seen.setdefault(key, a.index)
    return problems
