"""The generated tables of docs/: for each, its document, the figures it is built from
(docs/figures/<name>.json, or a data file a command writes) and how its rows are built.
tests/figures.py records the figures and writes the tables into the documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Cases = dict[str, dict[str, Any]]       # case -> its figures, in the order first recorded
# What every recorded case carries besides its figures (tests/figures.py): when and where.
PROVENANCE = ("measured", "commit", "dirty")


# ------------------------------------------------------------------ cells


def cell(value: Any) -> str:
    """A value as one Markdown table cell: '-' for none, numbers as recorded, text with its
    pipes escaped and its lines joined."""
    if value is None or value == [] or value == "":
        return "-"
    if isinstance(value, list):
        return "<br>".join(cell(v) for v in value)
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    return " ".join(str(value).split()).replace("|", "\\|")


def seconds(value: Any) -> str:
    """Tenths of a second, or two significant digits below one (a KV pull of 0.012 s)."""
    if value is None:
        return "-"
    return f"{value:,.1f} s" if abs(value) >= 1 else f"{value:.2g} s"


def row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def first_of(figures: dict[str, Any], prefix: str) -> Any:
    """The value of the first key starting with `prefix` (the fault cases name the event
    the client's wait is counted from: client_s_after_kill, client_s_after_stop)."""
    return next((v for k, v in figures.items() if k.startswith(prefix)), None)


def described(figures: dict[str, Any], labels: dict[str, str], skip: tuple[str, ...]) -> str:
    """The figures not in `skip`, as 'label value' pairs; labels ending in 's' after a
    space are seconds ('prefill leg s')."""
    parts = []
    for key, value in figures.items():
        if key in skip or key in PROVENANCE:
            continue
        label = labels.get(key, key.replace("_", " "))
        text = (seconds(value) if label.endswith(" s")
                else ", ".join(map(cell, value)) if isinstance(value, list) else cell(value))
        parts.append(f"{label.removesuffix(' s')} {text}")
    return "; ".join(parts) or "-"


# ------------------------------------------------------------------ the tables


def changes_and_faults(sources: dict[str, Cases]) -> list[str]:
    """What clients got during each change and each fault, and what the operator said."""
    lines = [row("change or fault", "sent", "failed", "cut off", "longest wait", "took",
                 "what the operator reported (Events; conditions)"),
             row("---", "---:", "---:", "---:", "---:", "---:", "---")]
    for cases in sources.values():
        for case, f in cases.items():
            reported = events_by_reason(f.get("events") or []) + list(f.get("conditions") or [])
            lines.append(row(cell(case), cell(f.get("sent")), cell(f.get("failed")),
                             cell(f.get("cut_off")), seconds(f.get("longest_wait_s")),
                             seconds(f.get("seconds")), cell(reported) if reported
                             else "nothing" if "events" in f else "-"))
    return lines


def events_by_reason(events: list[str]) -> list[str]:
    """Events ("Reason: message") once per reason, in order, with how many there were and
    the first one's message (a rollout posts a Created or Removed per object)."""
    by_reason: dict[str, list[str]] = {}
    for event in events:
        reason, _, message = event.partition(": ")
        by_reason.setdefault(reason, []).append(message)
    return [f"`{reason}`" + (f" x{len(messages)}" if len(messages) > 1 else "")
            + f": {messages[0]}" for reason, messages in by_reason.items()]


def fault_clients(sources: dict[str, Cases]) -> list[str]:
    """Per fault, the request it hit: what its client got and when, and the pod's return."""
    (cases,) = sources.values()
    lines = [row("fault", "what the client got", "client's wait after the fault",
                 "decode's failed NIXL transfers", "pod back after", "then"),
             row("---", "---", "---:", "---:", "---:", "---")]
    for case, f in cases.items():
        got = (cell(f["error"][:160]) if f.get("error")
               else f"{cell(f['tokens'])} tokens, no error" if "tokens" in f else "-")
        then = "-"
        if "served_again_s" in f:
            then = (f"served again after {seconds(f['served_again_s'])}, "
                    f"{cell(f.get('failed_after_resume', 0))} failed first")
        elif "equal_to_no_fault" in f or "non_streamed" in f:
            then = endpoint_outcome(f)
        lines.append(row(cell(case), got, seconds(first_of(f, "client_s_after")),
                         cell(f.get("nixl_failed")), seconds(f.get("back_s")), then))
    return lines


def endpoint_outcome(f: dict[str, Any]) -> str:
    """What the endpoint made of a fault (tests/cluster/day_two/test_data_path_faults.py)."""
    parts = []
    if "equal_to_no_fault" in f:
        parts.append(f"{cell(f['equal_to_no_fault'])} equal to their no-fault answer")
    if f.get("continued"):
        parts.append(f"{cell(int(f['continued']))} continued" + (
            f", pausing {seconds(f['pause_s'])} on average" if "pause_s" in f else ""))
    if "other_decode_nixl_tokens" in f:
        parts.append(f"finished by the other decode, which read "
                     f"{cell(int(f['other_decode_nixl_tokens']))} prompt tokens over NIXL and "
                     f"computed {cell(int(f['other_decode_computed_tokens']))}")
    if f.get("differed"):
        parts.append("recomputing the prefix flipped " + ", ".join(
            f"token {d['token']} (logit margin {cell(d['margin'])})" for d in f["differed"]))
    elif "closest_greedy_choice" in f:
        parts.append("no greedy choice flipped (the closest logit margin "
                     f"{cell(f['closest_greedy_choice'])})")
    if f.get("served_by_prefill"):
        parts.append(f"{cell(int(f['served_by_prefill']))} served by prefill alone while "
                     "decode restarted")
    if "non_streamed" in f:
        parts.append(f"non-streamed: {f['non_streamed']} after "
                     f"{seconds(f.get('non_streamed_s'))}")
    return ", ".join(parts)


def endpoint_overhead(sources: dict[str, Cases]) -> list[str]:
    """Latency straight through vllm-router, through pass-through proxies in Go and on the
    endpoint's stack (the physical baselines: one more hop, no work) and through the
    endpoint, side by side, with what each adds and each relay's CPU
    (benchmarks/endpoint_overhead.py): the median over rounds of each round's ratio, with its
    95% confidence interval where the run recorded one."""
    (cases,) = sources.values()
    lines = [row("run", "path", "TTFT (median; a round's first and last)",
                 "time between tokens (median)",
                 "added", "its CPU per 1,000 tokens"),
             row("---", "---", "---:", "---:", "---", "---:")]

    def added(f: dict[str, Any], key: str, suffix: str = "added") -> str:
        ci = f.get(f"{key}_{suffix}_ci95")
        return f"{f[f'{key}_{suffix}']:+.1%}" + (f" (95% CI {ci[0]:+.1%} to {ci[1]:+.1%})"
                                                 if ci else "")

    def ttft(f: dict[str, Any]) -> str:
        return f"{f['ttft_ms']:.1f} ms ({f['ttft_first_ms']:.1f}; {f['ttft_last_ms']:.1f})"

    def cpu(f: dict[str, Any]) -> str:
        return f"{f['cpu_ms_per_1000_tokens']:.0f} ms"
    for case, f in cases.items():
        router, endpoint = f["router"], f["endpoint"]
        run = cell(case)
        if "rounds" in f:
            run += f", {f['rounds']} rounds each way"
        if "load_average" in f:
            run += f", load average {f['load_average'][0]} to {f['load_average'][1]}"
        lines.append(row(run, "straight through vllm-router",
                         ttft(router), f"{router['tbt_ms']:.2f} ms", "-", "-"))
        for key, path in (("go_proxy", "through a pass-through proxy in Go (net/http: one "
                                       "more hop, no work, compiled)"),
                          ("proxy", "through a pass-through proxy on the endpoint's stack "
                                    "(aiohttp on uvloop: one more hop, no work)")):
            if key in f:
                lines.append(row("", path, ttft(f[key]),
                                 f"{f[key]['tbt_ms']:.2f} ms",
                                 f"TTFT {added(f[key], 'ttft')}, between tokens "
                                 f"{added(f[key], 'tbt')}", cpu(f[key])))
        verdict = ("held" if max(endpoint["ttft_added"], endpoint["tbt_added"])
                   <= f["max_added"] else "exceeded")
        said = (f"TTFT {added(endpoint, 'ttft')}, between tokens {added(endpoint, 'tbt')}; "
                f"at most {f['max_added']:.0%}: {verdict}")
        if "ttft_over_proxy" in endpoint:
            said += (f"; over the proxy: TTFT {added(endpoint, 'ttft', 'over_proxy')}, "
                     f"between tokens {added(endpoint, 'tbt', 'over_proxy')}")
        lines.append(row("", "through the endpoint", ttft(endpoint),
                         f"{endpoint['tbt_ms']:.2f} ms", said, cpu(endpoint)))
    return lines


REAL_ENGINE_LABELS = {"prompt_tokens": "prompt tokens", "completion_tokens": "tokens out",
                      "nixl_bytes": "NIXL bytes", "kv_tokens": "prompt tokens over NIXL",
                      "prefill_leg_s": "prefill leg s", "kv_pull_s": "KV pull s",
                      "decode_leg_s": "decode leg s", "ttft_s": "TTFT s"}


def real_engines(sources: dict[str, Cases]) -> list[str]:
    """One request's path, timed by the engines' own counters."""
    (cases,) = sources.values()
    lines = [row("step", "time", "what the engines' counters say"), row("---", "---:", "---")]
    for case, f in cases.items():
        took = f.get("seconds", f.get("total_s"))
        lines.append(row(cell(case), seconds(took),
                         described(f, REAL_ENGINE_LABELS, ("seconds", "total_s"))))
    return lines


def prefix_reuse(sources: dict[str, Cases]) -> list[str]:
    """Per routing, the prefix-cache hit rate of each turn (hits over queries of the prefill
    engines) and of turns 2 and later together."""
    (routings,) = sources.values()
    names = list(routings)
    turns = sorted({t for f in routings.values() for t in f.get("hit_rate_by_turn", {})},
                   key=int)
    lines = [row("turn", "prompt tokens", *(cell(n) for n in names)),
             row("---", "---", *("---:" for _ in names))]
    for turn in turns:
        sizes = next((f["prompt_tokens_by_turn"][turn] for f in routings.values()
                      if turn in f.get("prompt_tokens_by_turn", {})), None)
        lines.append(row(turn, "-" if sizes is None else "-".join(
            dict.fromkeys(f"{s:,}" for s in sizes)),
            *(f"{routings[n]['hit_rate_by_turn'][turn]:.2f}"
              if turn in routings[n].get("hit_rate_by_turn", {}) else "-" for n in names)))
    lines.append(row(f"{turns[1]}-{turns[-1]}" if len(turns) > 1 else "later", "",
                     *(f"**{routings[n]['later_turns_hit_rate']:.2f}**"
                       if "later_turns_hit_rate" in routings[n] else "-" for n in names)))
    return lines


def disaggregation_threshold(sources: dict[str, Cases]) -> list[str]:
    """Per new-turn size, TTFT through prefill and straight to decode on a session whose
    decode holds the prefix; then the measured crossover beside the predicted threshold."""
    (cases,) = sources.values()
    crossover = cases.get("crossover", {})
    lines = [row("new-turn tokens", "TTFT through prefill", "TTFT straight to decode",
                 "faster"), row("---:", "---:", "---:", "---")]
    sizes = sorted((f for case, f in cases.items() if case != "crossover"),
                   key=lambda f: f["new_tokens"])
    for f in sizes:
        faster = ("straight to decode" if f["straight_to_decode_s"] <= f["through_prefill_s"]
                  else "through prefill")
        lines.append(row(cell(f["new_tokens"]), seconds(f["through_prefill_s"]),
                         seconds(f["straight_to_decode_s"]), faster))
    if crossover:
        measured = crossover.get("measured_tokens")
        predicted = crossover.get("predicted_tokens")
        lines += ["", "Measured crossover: " + (
            f"{cell(measured)} new tokens" if measured is not None else
            f"none up to {cell(crossover.get('largest_measured'))} new tokens") +
            "; predicted threshold: " + (
            f"{cell(predicted)} new tokens" if predicted is not None else
            f"none up to {cell(crossover.get('priced_up_to'))} new tokens") +
            f" ({cell(crossover.get('priced_by'))})."]
    return lines


CPU_COSTS = "core/longctx_core/sizing/data/cpu_costs.json"
CPU_COST_ROWS = (("prefill", "prefill leg, its prefix cached there", "Token"),
                 ("decodeExtension", "decode computing the new tokens next to its prefix",
                  "Token"),
                 ("decodeLeg", "decode leg after a remote prefill, less its NIXL pull", "Token"),
                 ("kvTransfer", "NIXL pull, timed by decode", "Byte"))


def cpu_costs(sources: dict[str, Cases]) -> list[str]:
    """The decider's CPU costs (benchmarks/cpu_costs.py): each cost's fit, and for the two
    ways that compute the new tokens the slope each reads alone."""
    (cases,) = sources.values()
    f = cases["calibration"]
    lines = [row("cost", "fixed", "per token (per byte for NIXL)", "per token, fitted alone"),
             row("---", "---:", "---:", "---:")]
    for key, label, unit in CPU_COST_ROWS:
        per = f[key][f"per{unit}Seconds"]
        apart = f[key].get("apartPerTokenSeconds")
        lines.append(row(label, f"{f[key]['fixedSeconds'] * 1e3:.1f} ms",
                         f"{per * 1e9:.2f} ns a byte" if unit == "Byte" else
                         f"{per * 1e6:.0f} µs", "-" if apart is None else f"{apart * 1e6:.0f} µs"))
    lines += ["", f"{cell(f['engines'])}; {cell(f['machine'])}; NIXL moved "
                  f"{cell(f['kvBytesPerToken'])} B a token; the run took {cell(f['seconds'])} s."]
    return lines


def bench(sources: dict[str, Cases]) -> list[str]:
    """Each recorded sweep's report table, as `longctx bench` prints it."""
    from longctx_operator.bench.report import table

    (cases,) = sources.values()
    lines: list[str] = []
    for case, f in cases.items():
        if len(cases) > 1:
            lines += [f"**{cell(case)}**", ""]
        lines += table({"points": f["points"]}).splitlines() + [""]
    return lines[:-1]


CONTROL_PLANE_LABELS = {"kills": "SIGKILLs", "seconds": "over s",
                        "after_a_write": "after the operator had written",
                        "converged_s": "converged after s",
                        "foreign_writes": "foreign writes", "operator_writes": "operator writes",
                        "writes_after": "operator writes in the 5 s after",
                        "per_minute": "operator writes per minute",
                        "follower_wrote_s": "the follower wrote after s",
                        "peering_lifetime_s": "peering lifetime s",
                        "retry_delays_s": "retry delays (s)"}


def control_plane(sources: dict[str, Cases]) -> list[str]:
    (cases,) = sources.values()
    lines = [row("fault", "figures"), row("---", "---")]
    for case, f in cases.items():
        lines.append(row(cell(case), described(f, CONTROL_PLANE_LABELS, ())))
    return lines


def first_run(sources: dict[str, Cases]) -> list[str]:
    """Each recorded first run (tools/measure-first-run.sh): its steps, its total and CPU."""
    (cases,) = sources.values()
    lines = [row("run", "step", "time"), row("---", "---", "---:")]
    for case, f in cases.items():
        for step, took in f.get("steps (s)", {}).items():
            lines.append(row(cell(case), cell(step), seconds(took)))
        total = (f"{seconds(f['total (s)'])}, {cell(f.get('CPU (s)'))} CPU-seconds"
                 if f.get("total (s)") is not None else f"unfinished: {cell(f.get('unfinished'))}")
        lines.append(row(cell(case), f"all, load average {cell(f.get('load average at start'))}"
                         " at the start", total))
    return lines


def make_test(sources: dict[str, Cases]) -> list[str]:
    """Each recorded run of `make test` (tests/suite_times.py): its total, every real-engine
    test that took 5 s or more, and every other module that took 10 s or more."""
    (cases,) = sources.values()
    names = list(cases)
    rows: dict[str, list[str]] = {}
    for i, f in enumerate(cases.values()):
        for key, took in [*f["real_engine_tests_s"].items(),
                          *((m, t) for m, t in f["modules_s"].items() if t >= 10
                            and not m.startswith(("tests.cluster.day_two.",
                                                  "tests.cluster.test_real_engines")))]:
            rows.setdefault(key, ["-"] * len(names))[i] = seconds(took)
    lines = [row("test or module", *map(cell, names)), row("---", *["---:"] * len(names)),
             row("**the whole run**", *(f"**{seconds(f['seconds'])}**, {cell(f['tests'])} "
                                       f"tests, {cell(f['failures'])} failed, "
                                       f"{cell(f['cores'])} cores, load "
                                       f"{cell(f.get('load_average_at_start', '?'))}"
                                       for f in cases.values()))]
    lines += [row(key, *cells) for key, cells in rows.items()]
    return lines


def bound(value: Any) -> str:
    """A histogram quantile as its bucket's upper bound (None: beyond the last bucket)."""
    return "over the last bucket" if value is None else f"<= {cell(value)} s"


# The goals the operator is held to at GOAL_CRS CRs (docs/benchmarks.md); a run of
# benchmarks/operator_scale.py at that size that misses one fails.
GOAL_CRS = 100
GOAL_CPU_PER_CR_S = 0.05
GOAL_RECONCILE_P99_S = 1.0
OPERATOR_SCALE_GOALS = {"operator CPU per CR": f"<= {GOAL_CPU_PER_CR_S:g} s ({GOAL_CRS} CRs)",
                        "reconcile duration p50 / p99":
                            f"p99 <= {GOAL_RECONCILE_P99_S:g} s ({GOAL_CRS} CRs)",
                        "API writes per CR at steady state": "0"}


def operator_scale(sources: dict[str, Cases]) -> list[str]:
    """Each recorded run of benchmarks/operator_scale.py, one column a run, beside the goals."""
    (cases,) = sources.values()
    runs = list(cases.values())

    def each(fn: Callable[[dict[str, Any]], str]) -> list[str]:
        return [fn(f) for f in runs]

    rows = {
        "children per CR": each(lambda f: cell(f["children_per_cr"])),
        "time until all CRs exist": each(lambda f: seconds(f["crs_created_s"])),
        "time until all children exist (creationTimestamp, whole seconds)": each(
            lambda f: f"<= {seconds(f['children_created_s'])}"
            if f["children_created_s"] is not None else
            f"not reached ({cell(f['children_found'])} of {cell(f['children_expected'])})"),
        "create -> Ready p50 / p99": each(
            lambda f: f"{seconds(f['ready_p50_s'])} / **{seconds(f['ready_p99_s'])}** "
                      f"({cell(f['ready'])} Ready)" if f["ready"] else "none Ready"),
        "reconcile duration p50 / p99": each(
            lambda f: f"{bound(f['reconcile_p50_s'])} / **{bound(f['reconcile_p99_s'])}** "
                      f"({100 * f['reconciles_within_1s']:.1f}% within 1 s)"),
        "wait in the work queue p50 / p99": each(
            lambda f: f"{bound(f['queue_p50_s'])} / {bound(f['queue_p99_s'])}"),
        "reconciles per CR": each(lambda f: f"{f['reconciles'] / f['crs']:.1f}"),
        "API writes per CR at creation": each(lambda f: f"{f['writes_per_cr_at_creation']:.1f}"),
        "API writes per CR at steady state": each(
            lambda f: f"**{f['writes_per_cr_steady']:.2f}** (over {cell(f['steady_s'])} s)"),
        "operator resident memory": each(lambda f: f"{f['operator_rss_mib']:.0f} MiB"),
        "operator CPU per CR": each(lambda f: f"**{f['operator_cpu_per_cr_s']:.3f} s**"),
        "CPU until all Ready, by process": each(lambda f: "<br>".join(
            f"{name} {seconds(took)}" for name, took in f["cpu_s"].items())),
        "all of that CPU over the machine's cores": each(
            lambda f: f"{seconds(f['all_cpu_over_cores_s'])} over {cell(f['cores'])} cores "
                      f"(the operator's share {100 * f['operator_cpu_share']:.0f}%)"),
        "API requests per CR until all Ready (every client), busiest": each(
            lambda f: "<br>".join(f"{key} {n:.2f}" for key, n in f["api_requests_per_cr"]
                                  .items())),
    }
    lines = [row("metric", *(cell(c) for c in cases), "goal"),
             row("---", *("---" for _ in cases), "---")]
    lines += [row(name, *cells, OPERATOR_SCALE_GOALS.get(name, ""))
              for name, cells in rows.items()]
    return lines


@dataclass(frozen=True)
class Table:
    doc: str                        # under docs/
    sources: tuple[str, ...]        # docs/figures/<source>.json
    build: Callable[[dict[str, Cases]], list[str]]
    fills: str                      # the command whose run records the figures


DAY_TWO = "`make test` (the day-two modules alone: `make test-day2`)"
TABLES = {
    "changes-and-faults": Table("data-path.md", ("traffic-rollouts", "data-path-faults"),
                                changes_and_faults, DAY_TWO),
    "fault-clients": Table("data-path.md", ("data-path-faults",), fault_clients, DAY_TWO),
    "real-engines": Table("data-path.md", ("real-engines",), real_engines,
                          "`make test` (tests/cluster/test_real_engines.py)"),
    "prefix-reuse": Table("data-path.md", ("prefix-reuse",), prefix_reuse, DAY_TWO),
    "disaggregation-threshold": Table("data-path.md", ("disaggregation-threshold",),
                                      disaggregation_threshold, DAY_TWO),
    "endpoint-overhead": Table("data-path.md", ("endpoint-overhead",), endpoint_overhead,
                               "`benchmarks/endpoint_overhead.py`"),
    "bench": Table("bench.md", ("bench",), bench, DAY_TWO),
    "control-plane": Table("reliability.md", ("control-plane-faults",), control_plane,
                           "`make test` (tests/cluster/test_control_plane_faults.py)"),
    "cpu-costs": Table("performance.md", (CPU_COSTS,), cpu_costs,
                       "`benchmarks/cpu_costs.py` (then `make figures`)"),
    "make-test": Table("test-harness.md", ("make-test",), make_test,
                       "`tools/measure-make-test.sh`"),
    "operator-scale": Table("benchmarks.md", ("operator-scale",), operator_scale,
                            "`benchmarks/operator_scale.py` (then `make figures`)"),
    "first-run": Table("control-plane.md", ("first-run",), first_run,
                       "`tools/measure-first-run.sh TARGET...`"),
}
