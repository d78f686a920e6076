"""Renders a CapacityPlan for people (`longctx plan -o table`) and machines (`-o json`).

Both renderings read `plan.to_json()`, so they cannot disagree with status.plan.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any, Optional

from .planner import CapacityPlan


def render_json(plan: CapacityPlan) -> str:
    """The plan as indented JSON (the same object the operator writes to status.plan)."""
    return json.dumps(plan.to_json(), indent=2, allow_nan=False)


def _int(value: Optional[int], unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,}{(' ' + unit) if unit else ''}"


def _gib(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.2f} GiB"


def _yes(value: Optional[bool]) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def _rows(role: dict[str, Any]) -> list[str]:
    hs = role.get("hiSparse")
    if hs is None:
        host, requests = "-", "-"
    elif hs["enabled"]:
        host = f"{_gib(hs['hostPoolGiBPerRank'])} (needs {_gib(hs['hostPoolMinGiBPerRank'])})"
        requests = f"{hs['hostPoolRequestsPerRank']} / {hs['gpuRequestsPerRank']}"
    else:
        host, requests = "off", "-"
    source = role["kvBudgetSource"]
    budget = _gib(role["kvBudgetGiBPerGpu"])
    if source == "spec.capacity.kvBudgetPerGpu":
        budget += " (set)"
    elif source == "estimate":
        budget += " (estimate)"
    return [
        role["layout"],
        f"{role['gpus']} / {role['engineRanks']}",
        _gib(role["weightsGiBPerGpu"]),
        _gib(role["reserveGiBPerGpu"]),
        budget,
        _gib(role["kvGiBPerGpu"]),
        _yes(role["fits"]),
        _int(role["maxConcurrentAtMaxContext"]),
        _int(role["headsPerGpu"]),
        f"{role['sparseMlaFlopsPerByte']:.1f} FLOP/B",
        _int(role["indexerCrossoverTokens"], "tokens"),
        f"{_gib(role['cpuOffloadGiBPerRank'])} ({_int(role['cpuOffloadTokensPerRank'], 'tokens')})",
        _int(role["cpuOffloadTokens"], "tokens"),
        host,
        requests,
    ]


_LABELS = [
    "Layout",
    "GPUs / engine ranks",
    "Weights per GPU",
    "Activation reserve per GPU",
    "KV budget per GPU",
    "KV per GPU, one request",
    "Fits max context",
    "Max concurrent at max context",
    "Query heads per GPU",
    "Sparse-MLA intensity",
    "Indexer > sparse MLA beyond",
    "CPU offload per rank",
    "CPU offload, all ranks",
    "HiSparse host pool per rank",
    "HiSparse requests/rank host/GPU",
]


def render_table(plan: CapacityPlan) -> str:
    """A readable, aligned report with units."""
    data = plan.to_json()
    bpt = data["kvBytesPerToken"]
    arch = plan.architecture
    name = data["model"]["preset"] or "explicit architecture"
    verdict = "FITS" if data["fits"] else "REFUSED"
    lines = [
        f"Capacity plan: {name}, KV cache {data['model']['kvCacheDtype']}, "
        f"max context {_int(data['maxContextTokens'], 'tokens')}: {verdict}",
        "",
        "KV bytes per token",
    ]
    parts = [
        ("MLA", bpt["mla"], f"{arch.layers} layers"),
        ("Indexer", bpt["indexer"], f"{arch.indexLayers} layers"),
        ("MTP", bpt["mtp"], f"{arch.mtpLayers} layer(s), MLA + indexer"),
        ("Total", bpt["total"], ""),
    ]
    width = max(len(f"{v:,}") for _, v, _ in parts)
    for label, value, note in parts:
        lines.append(f"  {label:<8} {value:>{width},} B" + (f"   ({note})" if note else ""))
    lines.append(f"One request at max context: {_gib(data['request']['kvGiB'])} "
                 f"({_int(data['request']['kvBytes'], 'B')})")
    lines.append("")

    columns = [_rows(data["prefill"]), _rows(data["decode"])]
    label_w = max(len(label) for label in _LABELS)
    col_w = [max(len("Prefill"), *(len(c) for c in columns[0])),
             max(len("Decode"), *(len(c) for c in columns[1]))]
    lines.append(f"{'':<{label_w}}  {'Prefill':<{col_w[0]}}  {'Decode':<{col_w[1]}}".rstrip())
    lines.append(f"{'-' * label_w}  {'-' * col_w[0]}  {'-' * col_w[1]}")
    for i, label in enumerate(_LABELS):
        lines.append(f"{label:<{label_w}}  {columns[0][i]:<{col_w[0]}}  "
                     f"{columns[1][i]:<{col_w[1]}}".rstrip())
    if data["refusal"]:
        lines.append("")
        lines.extend(textwrap.wrap("Refused: " + data["refusal"], width=100,
                                   subsequent_indent="  "))
    if data["notes"]:
        lines.append("")
    for note in data["notes"]:
        lines.extend(textwrap.wrap("Note: " + note, width=100, subsequent_indent="  "))
    return "\n".join(lines) + "\n"
