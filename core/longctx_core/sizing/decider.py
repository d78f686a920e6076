"""`spec.router.disaggregation.decider: auto`: the threshold of llm-d's prefix-based decider
(`nonCachedTokens`), derived from the plan's performance model for the spec's layout.

A turn of N new tokens arrives at a decode engine that holds the conversation's prefix. It
can go two ways:

    straight to decode   decode computes the N tokens next to the prefix it holds and
                         answers the first token from that pass;
    through prefill      the prefill leg computes them (its pod holds the prefix too: the
                         prefix-aware picker keeps a session on it), NIXL moves their KV to
                         decode, and decode runs one step for the first token.

The threshold is the smallest N for which the second is faster: below it the picker sends
the turn straight to decode. On GPUs both ways are priced by the performance model
(phase_timing.py) on the H200 profile, at a turn on half the context the plan is for; on
the CPU platform by the costs measured on the project's machines (cpu_costs.py). When
what prefill saves a token does not pay back the prefill leg within the context the plan
is for, `auto` never disaggregates a turn (the decider's `nonCachedTokens: 0`). Queueing and the stall a
computed turn causes to decode's other streams are not priced (docs/performance.md).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from longctx_core.api.spec import LongContextDeploymentSpec, dump_spec, load_spec
from longctx_core.sizing import cpu_platform, kv_sizing, models, planner
from longctx_core.sizing.cost_terms import model_shape
from longctx_core.sizing.cpu_costs import cpu_costs
from longctx_core.sizing.hardware import H200
from longctx_core.sizing.phase_timing import decode_step, kv_transfer_seconds, prefill

FIELD = "spec.router.disaggregation"
# llm-d's decider plugins (llm-d-router v0.10).
PREFIX_BASED = "prefix-based-pd-decider"
ALWAYS = "always-disagg-pd-decider"


@dataclass(frozen=True)
class Turn:
    """The time of one turn of `new_tokens` on `context_tokens` held by decode, both ways."""

    new_tokens: int
    direct_s: float         # straight to decode
    prefill_s: float        # the prefill leg
    transfer_s: float       # NIXL, the new tokens' KV
    first_step_s: float     # decode's leg besides the pull (its first token)

    @property
    def disaggregated_s(self) -> float:
        return self.prefill_s + self.transfer_s + self.first_step_s

    def to_json(self) -> dict[str, Any]:
        return {"newTokens": self.new_tokens, "straightToDecodeSeconds": round(self.direct_s, 6),
                "throughPrefillSeconds": round(self.disaggregated_s, 6),
                "prefillSeconds": round(self.prefill_s, 6),
                "kvTransferSeconds": round(self.transfer_s, 6),
                "decodeLegSeconds": round(self.first_step_s, 6)}


@dataclass(frozen=True)
class Threshold:
    """What `auto` renders, and why."""

    decider: str                 # the picker plugin: prefix-based-pd-decider or always-...
    non_cached_tokens: int       # its parameter; 0 = never disaggregate (the decider's rule)
    crossover_tokens: Optional[int]   # None: prefill never pays back within the context
    context_tokens: int          # the prefix decode holds in the priced turn
    priced_by: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"decider": self.decider, "nonCachedTokens": self.non_cached_tokens,
                "crossoverTokens": self.crossover_tokens, "contextTokens": self.context_tokens,
                "pricedBy": self.priced_by, "reason": self.reason}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


# ---------------------------------------------------------------- one turn, both ways


def _gpu_turn(spec: LongContextDeploymentSpec) -> Optional[Callable[[int, int], Turn]]:
    shape = model_shape(spec)
    if shape is None:
        return None
    prefill_layout, decode_layout = planner.role_layouts(spec)

    def turn(new: int, context: int) -> Turn:
        total = context + new
        return Turn(new,
                    direct_s=prefill(shape, decode_layout, H200, total, context).seconds,
                    prefill_s=prefill(shape, prefill_layout, H200, total, context).seconds,
                    transfer_s=kv_transfer_seconds(spec, H200, new),
                    first_step_s=decode_step(spec, shape, decode_layout, H200, total,
                                             1).seconds)
    return turn


def kv_bytes_per_token(spec: LongContextDeploymentSpec) -> int:
    arch = models.resolve_architecture(spec.model)
    return kv_sizing.kv_bytes_per_token(arch, spec.engine.kvCacheDtype).total


def _cpu_turn(spec: LongContextDeploymentSpec) -> Callable[[int, int], Turn]:
    costs = cpu_costs()
    per_token = kv_bytes_per_token(spec)

    def turn(new: int, context: int) -> Turn:
        return Turn(new, direct_s=costs.decode_extension(new), prefill_s=costs.prefill(new),
                    transfer_s=costs.kv_transfer(per_token * new),
                    first_step_s=costs.decode_leg(new))
    return turn


def turn_pricer(spec: LongContextDeploymentSpec) -> Optional[Callable[[int, int], Turn]]:
    """(new tokens, context tokens) -> Turn for the spec's platform; None when the model
    cannot price it (an explicit architecture on GPUs)."""
    return _cpu_turn(spec) if cpu_platform.is_cpu(spec) else _gpu_turn(spec)


def crossover(turn: Callable[[int, int], Turn], context: int, most: int) -> Optional[int]:
    """The fewest new tokens (1..most) for which going through prefill is faster; None if
    none is. Straight to decode grows faster with the tokens than through prefill once
    prefill computes a token faster, so the two cross once: bisection."""
    def faster(n: int) -> bool:
        t = turn(n, context)
        return t.disaggregated_s < t.direct_s
    if most < 1 or not faster(most):
        return None
    low, high = 0, most        # faster(high); not known for low
    if faster(1):
        return 1
    low = 1
    while high - low > 1:
        mid = (low + high) // 2
        if faster(mid):
            high = mid
        else:
            low = mid
    return high


# ---------------------------------------------------------------- the threshold


def priced_context(spec: LongContextDeploymentSpec) -> int:
    """The prefix of the priced turn: half the context the plan is for."""
    return spec.maxContextTokens // 2


def _derive(spec: LongContextDeploymentSpec) -> Threshold:
    turn = turn_pricer(spec)
    context = priced_context(spec)
    if turn is None:
        return Threshold(ALWAYS, 0, None, context, "not priced",
                         "the performance model prices presets only (an explicit "
                         "architecture lacks the widths); every request is disaggregated. "
                         f"Set {FIELD}.decider to prefix-based with nonCachedTokens to choose "
                         "a threshold")
    cpu = cpu_platform.is_cpu(spec)
    priced_by = f"CPU calibration ({cpu_costs().measured})" if cpu else \
        f"performance model ({H200.name.split(' (')[0]})"
    most = spec.maxContextTokens - context
    found = crossover(turn, context, most)
    shown = turn(found if found else most, context)
    where = f"a turn on {context:,} tokens decode holds"
    if found is None:
        return Threshold(
            PREFIX_BASED, 0, None, context, priced_by,
            f"{where}: straight to decode stays faster up to {most:,} new tokens "
            f"({_ms(shown.direct_s)} against {_ms(shown.prefill_s)} of prefill, "
            f"{_ms(shown.transfer_s)} of KV transfer and {_ms(shown.first_step_s)} of decode "
            "leg): within the context the plan is for, what prefill saves a token never pays "
            "back the prefill leg; nonCachedTokens 0 keeps every request on decode")
    if found == 1:
        return Threshold(
            ALWAYS, 0, 1, context, priced_by,
            f"{where}: through prefill is faster even for one new token "
            f"({_ms(shown.disaggregated_s)} against {_ms(shown.direct_s)}): every request "
            "is disaggregated")
    return Threshold(
        PREFIX_BASED, found, found, context, priced_by,
        f"{where}: at {found:,} new tokens straight to decode ({_ms(shown.direct_s)}) is "
        f"no longer faster than through prefill ({_ms(shown.disaggregated_s)}: prefill "
        f"{_ms(shown.prefill_s)}, KV transfer {_ms(shown.transfer_s)}, decode leg "
        f"{_ms(shown.first_step_s)}); fewer go straight to decode")


@functools.lru_cache(maxsize=256)
def _derived(spec_json: str) -> Threshold:
    return _derive(load_spec(json.loads(spec_json)))


def threshold(spec: LongContextDeploymentSpec) -> Threshold:
    """What `auto` derives for the spec (computed once per distinct spec: the operator
    renders the picker config at every reconcile)."""
    return _derived(json.dumps(dump_spec(spec), sort_keys=True))


def decider(spec: LongContextDeploymentSpec) -> Threshold:
    """The decider the picker gets: `auto`'s derived threshold, or the spec's explicit one."""
    d = spec.router.disaggregation
    if d.decider == "auto":
        return threshold(spec)
    context = priced_context(spec)
    if d.decider == "always":
        return Threshold(ALWAYS, 0, None, context, "spec",
                         f"{FIELD}.decider is always")
    return Threshold(PREFIX_BASED, d.nonCachedTokens, None, context, "spec",
                     f"{FIELD}.nonCachedTokens is {d.nonCachedTokens}")


def disaggregation_report(spec: LongContextDeploymentSpec) -> dict[str, Any]:
    """`longctx plan`'s `disaggregation`: what `auto` derives for the spec, and the decider
    the spec renders (the same unless it sets one)."""
    chosen = decider(spec)
    return {**threshold(spec).to_json(), "specDecider": spec.router.disaggregation.decider,
            "rendered": {"decider": chosen.decider, "nonCachedTokens": chosen.non_cached_tokens}}
