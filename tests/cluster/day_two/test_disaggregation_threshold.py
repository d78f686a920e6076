"""The disaggregation threshold (`decider: auto`, longctx_core/sizing/decider.py) on the real
engines of the package's deployment (the tiny dense model, whose prefix caching the CPU
backend keeps).

For each new-turn size, two sessions whose first turn went through prefill and NIXL, so that
decode and one prefill pod hold the prefix, send a second turn of the prefix plus the new
tokens, one straight to decode and one through prefill (the prefill leg to the pod holding
the prefix, then decode with its `kv_transfer_params`). Decode's counters show what each way
computed and moved; the measured crossover stands beside the threshold the plan predicts
for this deployment. Bounded: 3 x 9 sizes, 7 engine legs each (189 requests), each at most
300 s.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import pytest

from longctx_core import contract
from longctx_core.api.spec import load_spec
from longctx_engine.vllm_plugin import bound_cores
from longctx_core.sizing.decider import threshold
from tests.cluster.real_engines import engine_cores, http_json, kv_counters, words
from tests.cluster.sessions import REQUEST_TIMEOUT, block_tokens
from tests.figures import Figures

pytestmark = pytest.mark.cluster

# New-turn sizes, from a few tokens to most of what a 4,096-token context leaves after the
# prefix (deployment.py raises the tiny models' context to their 4,096 positions).
TURN_SIZES = (8, 64, 256, 512, 1024, 1536, 2048, 2560, 3072)
PREFIX_BLOCKS = 4
COMPLETIONS_PATH = "/v1/completions"
FIGURES = Figures("disaggregation-threshold", "threshold")
AGREEMENT = 0.25
# Each size three times, for medians: the 2-core machine's other work moves single timings.
REPEATS = 3


@dataclass
class TurnTiming:
    """One new-turn size: TTFT both ways (each leg with `max_tokens` 1, timed by the client),
    and decode's counters for each."""
    uncached: int             # prompt tokens decode does not hold: the decider's count
    through_prefill_s: float
    straight_s: float
    straight: dict            # decode's counter deltas, turn straight to decode
    through: dict             # decode's counter deltas, turn through prefill


def _complete(url: str, body: dict) -> tuple[dict, float]:
    started = time.monotonic()
    answer = http_json(f"{url}{COMPLETIONS_PATH}", body, REQUEST_TIMEOUT)
    return answer, time.monotonic() - started


def _prefill_leg(prefill: str, body: dict) -> dict:
    """The sidecar's prefill leg (`do_remote_decode`), for a completion; its KV params."""
    answer, _ = _complete(prefill, dict(body, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None}))
    return answer["kv_transfer_params"]


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


def _time_turn(prefill: str, decode: str, model: str, block: int, new: int,
               seed: int) -> TurnTiming:
    """Two sessions of two turns on `prefill` and decode; the second turn measured both ways.
    A prompt of n words is n tokens for the tiny models' tokenizer, so the prefix fills whole
    blocks and decode holds all of it."""
    def body(prompt: str) -> dict:
        return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                "ignore_eos": True}

    prefixes = [words(PREFIX_BLOCKS * block, seed), words(PREFIX_BLOCKS * block, seed + 1)]
    held = []
    for prefix in prefixes:
        params = _prefill_leg(prefill, body(prefix))
        answer, _ = _complete(decode, dict(body(prefix), kv_transfer_params=params))
        held.append(answer["usage"]["prompt_tokens"] // block * block)
    extension = " " + words(new, seed + 2)

    before = kv_counters(decode)
    answer, straight_s = _complete(decode, body(prefixes[0] + extension))
    straight = _delta(before, kv_counters(decode))
    uncached = answer["usage"]["prompt_tokens"] - held[0]

    before = kv_counters(decode)
    started = time.monotonic()
    params = _prefill_leg(prefill, body(prefixes[1] + extension))
    _complete(decode, dict(body(prefixes[1] + extension), kv_transfer_params=params))
    through_s = time.monotonic() - started
    return TurnTiming(uncached, through_s, straight_s, straight,
                      _delta(before, kv_counters(decode)))


def medians(samples: list[TurnTiming]) -> list[tuple[int, float, float, float]]:
    """Per new-turn size: (tokens, median TTFT through prefill, median straight to decode,
    median of the paired differences through - straight of the same repeat)."""
    out = []
    for n in sorted({t.uncached for t in samples}):
        runs = [t for t in samples if t.uncached == n]
        out.append((n, statistics.median(t.through_prefill_s for t in runs),
                    statistics.median(t.straight_s for t in runs),
                    statistics.median(t.through_prefill_s - t.straight_s for t in runs)))
    return out


def measured_crossover(rows: list[tuple[int, float, float, float]]) -> float | None:
    """The new-turn size where the least-squares line through the per-size median paired
    differences (through prefill - straight) crosses zero from above: both ways grow
    linearly with the new tokens (decider.py), so their difference does too, and a line fitted
    over every size is steadier than the sign of any one size's timings. None when the line
    does not fall, or crosses outside the sizes measured."""
    sizes = [float(size) for size, *_ in rows]
    gaps = [gap for *_, gap in rows]
    slope, intercept = statistics.linear_regression(sizes, gaps)
    if slope >= 0:
        return None
    root = -intercept / slope
    return root if sizes[0] <= root <= sizes[-1] else None


@pytest.fixture(scope="module")
def turn_sizes(deployment):
    """Per new-turn size, both ways, REPEATS times (the sizes interleaved, the prefill pods
    alternated); and the threshold the plan predicts for the deployment."""
    deployment.settle()
    prefills = sorted(deployment.urls("prefill").values())
    (decode,) = deployment.urls("decode").values()
    block = block_tokens(decode)
    started = time.monotonic()
    samples = []
    for repeat in range(REPEATS):
        for i, new in enumerate(TURN_SIZES):
            k = repeat * len(TURN_SIZES) + i
            samples.append(_time_turn(prefills[k % len(prefills)], decode, deployment.model,
                                      block, new, 300 + 3 * k))
    rows = medians(samples)
    predicted = threshold(load_spec(deployment.cr["spec"]))
    measured = measured_crossover(rows)
    for size, through, straight, _ in rows:
        runs = [t for t in samples if t.uncached == size]
        FIGURES.record(f"{size} new tokens", {
            "new_tokens": size, "through_prefill_s": round(through, 4),
            "straight_to_decode_s": round(straight, 4),
            "through_prefill_runs_s": [round(t.through_prefill_s, 4) for t in runs],
            "straight_to_decode_runs_s": [round(t.straight_s, 4) for t in runs]})
    FIGURES.record("crossover", {
        "measured_tokens": None if measured is None else round(measured),
        "predicted_tokens": predicted.crossover_tokens,
        "largest_measured": max(TURN_SIZES), "priced_up_to": deployment.cr["spec"][
            "maxContextTokens"] - predicted.context_tokens,
        "priced_by": predicted.priced_by, "seconds": round(time.monotonic() - started, 1)})
    return samples, rows, measured, predicted


def test_each_engine_runs_on_the_cores_its_threads_bind_names(deployment):
    """Both ways are priced with each engine on its own cores (the calibration's), so the
    timings compare only where every engine process stays on its role's threadsBind."""
    binds = deployment.cr["spec"]["engine"]["cpu"]["threadsBind"]
    for role in contract.ROLES:
        for pod in deployment.pods(role):
            cores = engine_cores(pod)
            assert len(cores) >= 2, (pod["metadata"]["name"], cores)   # API server, engine core
            assert set(map(frozenset, cores.values())) == {frozenset(bound_cores(binds[role]))}, (
                pod["metadata"]["name"], binds[role], cores)


def test_straight_to_decode_computes_the_new_tokens_and_moves_nothing(turn_sizes):
    samples, *_ = turn_sizes
    for t in samples:
        assert t.straight["local_compute"] == t.uncached, t
        assert t.straight["nixl_bytes"] == 0 and t.straight["external_kv_transfer"] == 0, t
        # Through prefill, what decode did not hold came over NIXL; it computed nothing.
        assert t.through["external_kv_transfer"] == t.uncached, t
        assert t.through["local_compute"] == 0 and t.through["nixl_failed"] == 0, t
    assert [t.uncached for t in samples] == list(TURN_SIZES) * REPEATS


def test_measured_crossover_agrees_with_the_predicted_threshold(turn_sizes):
    """Within 25% of the prediction; or, where the plan predicts no crossover within the
    context it prices, none within the sizes measured."""
    _, rows, measured, predicted = turn_sizes
    table = [(size, round(through, 3), round(straight, 3), round(gap, 3))
             for size, through, straight, gap in rows]
    expected = predicted.crossover_tokens
    if expected is None or expected > max(TURN_SIZES):
        assert measured is None, (f"measured a crossover at {measured:.0f} new tokens, the "
                                  f"plan predicts {expected}: {predicted.reason}; "
                                  "(tokens, through prefill s, straight s, paired difference "
                                  f"s): {table}")
    else:
        assert measured is not None and abs(measured - expected) <= AGREEMENT * expected, (
            f"measured {measured}, predicted {expected}: {table}")
