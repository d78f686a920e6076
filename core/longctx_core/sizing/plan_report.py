"""Renders a CapacityPlan for people (`longctx plan -o table`) and machines (`-o json`).

Both renderings read `plan.to_json()`, so they cannot disagree with status.plan.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any, Optional

from longctx_core.sizing.planner import CapacityPlan


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


# ------------------------------------------------------------ performance


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def _rate(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render_performance_line(perf: Optional[dict[str, Any]]) -> str:
    """One line: the prediction at maxContextTokens (plain `longctx plan`)."""
    if perf is None:
        return "Performance: not modelled for an explicit architecture (needs a preset)\n"
    pre, dec = perf["prefill"], perf["decode"]
    return (f"Performance at max context ({perf['hardware'].split(' (')[0]}): TTFT "
            f"{_seconds(perf['ttftSeconds'])} (prefill {pre['bound']}-bound), decode "
            f"{_rate(dec['tokensPerSecondPerUser'])} tok/s/user at {perf['concurrency']} "
            f"concurrent ({dec['bound']}-bound)\n")


def render_decode_loss(perf: Optional[dict[str, Any]]) -> str:
    """What a client pays when its decode engine dies (performance.decodeLoss), in words."""
    if perf is None:
        return ""
    loss = perf["decodeLoss"]
    alone = loss["prefillOnly"]
    source = (f"its {loss['contextTokens'] - loss['generatedTokens']:,}-token prefix read "
              f"back from prefill's CPU offload in {_seconds(loss['prefixLoadSeconds'])}"
              if loss["prefixInCpuOffload"] else
              "its prefix does not fit a prefill rank's CPU offload, so it is prefilled again")
    speed = "-" if alone["speedOfPd"] is None else f"{alone['speedOfPd']:.2f}x"
    text = (f"Decode loss at {loss['contextTokens']:,} tokens ({loss['generatedTokens']:,} "
            f"generated): the answer continues on another decode after a "
            f"{_seconds(loss['pauseSeconds'])} pause ({source}, the generated tokens "
            f"prefilled in {_seconds(loss['replayPrefillSeconds'])}, NIXL "
            f"{_seconds(loss['kvTransferSeconds'])}), against "
            f"{_seconds(loss['fullReprefillPauseSeconds'])} for a full re-prefill. With no "
            f"decode Ready, prefill serves alone ({alone['layout'].split(';')[0]}): a "
            f"{_seconds(alone['pauseSeconds'])} pause, then "
            f"{_rate(alone['tokensPerSecondPerUser'])} tok/s/user at {perf['concurrency']} "
            f"concurrent ({alone['bound']}-bound, {alone['requestsHeld']} held; {speed} the "
            f"P/D speed)")
    return "\n".join(textwrap.wrap(text, width=100, subsequent_indent="  ")) + "\n"


def render_performance(perf: Optional[dict[str, Any]]) -> str:
    """The performance section of `longctx plan --prompt-tokens N`."""
    if perf is None:
        return render_performance_line(perf)
    pre, xfer, dec = perf["prefill"], perf["kvTransfer"], perf["decode"]
    cached = f", {perf['cachedTokens']:,} cached" if perf["cachedTokens"] else ""
    rows = [
        ("Prefill", f"{_seconds(pre['seconds'])}, {pre['bound']}-bound ({pre['layout']})"),
        ("  DCP all-gather within it", f"{_seconds(pre['dcpAllGatherSeconds'])} "
                                       f"(+{pre['dcpOverheadPercent']}%)"),
        ("  largest terms", ", ".join(f"{k} {_seconds(v)}"
                                      for k, v in list(pre["partsSeconds"].items())[:3])),
        ("KV transfer (NIXL)", f"{_seconds(xfer['seconds'])}, {xfer['bound']}-bound"),
        ("TTFT", _seconds(perf["ttftSeconds"])),
        ("Decode step", f"{_seconds(dec['stepSeconds'])}, {dec['bound']}-bound, "
                        f"{dec['batchPerRank']} request(s) per rank ({dec['layout']})"),
        ("  largest terms", ", ".join(f"{k} {_seconds(v)}"
                                      for k, v in list(dec["partsSeconds"].items())[:3])),
        ("  HiSparse host gathers", f"{_seconds(dec['hostGatherSeconds'])} (PCIe, overlapped)"),
        ("Tokens/s per user", f"{_rate(dec['tokensPerSecondPerUser'])} (acceptance length "
                              f"{perf['acceptanceLength']})"),
        ("Tokens/s per decode GPU", _rate(dec["tokensPerSecondPerGpu"])),
    ]
    if dec["requestsHeld"] < perf["concurrency"]:
        rows.append(("  requests held", f"{dec['requestsHeld']} of {perf['concurrency']}: the "
                                        "rest wait"))
    if "requestSeconds" in perf:
        rows.append(("Request, end to end", _seconds(perf["requestSeconds"])))
    width = max(len(label) for label, _ in rows)
    lines = [f"Performance: {perf['promptTokens']:,}-token prompt{cached}, "
             f"{perf['outputTokens']:,} output tokens, {perf['concurrency']} concurrent, "
             f"{perf['hardware']}", ""]
    lines += [f"{label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines) + "\n"


def render_compare(rows: list[dict[str, Any]]) -> str:
    """`longctx plan --compare`: one row per layout, ratios against the spec's."""
    header = ("layout", "prefill", "decode", "fits max ctx", "TTFT", "x", "tok/s/user", "x")
    table = [header]
    for r in rows:
        fit = "yes" if r["fitsMaxContext"] else "NO (" + ", ".join(r["refusedRoles"]) + ")"
        ratio = (lambda v: "-" if v is None else f"{v:.2f}")
        table.append((r["name"], r["prefillLayout"].split(";")[0],
                      r["decodeLayout"].split(";")[0], fit, _seconds(r["ttftSeconds"]),
                      ratio(r["ttftRatio"]), _rate(r["tokensPerSecondPerUser"]),
                      ratio(r["tokensPerSecondPerUserRatio"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("(- : the layout cannot hold the prompt; x: ratio against this spec)")
    return "\n".join(lines) + "\n"



def _decider_text(decider: str, non_cached: int) -> str:
    if decider == "always-disagg-pd-decider":
        return "every request through prefill"
    if non_cached == 0:
        return "no request through prefill (nonCachedTokens 0)"
    return f"through prefill from {non_cached:,} uncached tokens (nonCachedTokens)"


def render_disaggregation(report: dict[str, Any], router: str, decides: bool) -> str:
    """The P/D decider threshold `auto` derives (decider.py), why, and what is rendered;
    `router` names the spec's router, `decides` whether it has a P/D decider."""
    text = (f"Disaggregation threshold (auto, {report['pricedBy']}): "
            f"{_decider_text(report['decider'], report['nonCachedTokens'])}; {report['reason']}")
    rendered = report["rendered"]
    if not decides:
        text += (f". {router} has no decider: it sends every request through prefill, "
                 "and this threshold is what llm-d's picker would get")
    elif report["specDecider"] != "auto":
        text += (f". The spec sets decider {report['specDecider']}: the picker gets "
                 f"{_decider_text(rendered['decider'], rendered['nonCachedTokens'])}")
    return "\n".join(textwrap.wrap(text, width=100, subsequent_indent="  ")) + "\n"
