"""What the client-facing endpoint did for the answers of a CR: continued after a fault,
given up, served by prefill alone; for `status.answers` and an Event when answers were
continued or lost.

The engine watch (runtime/engine_watch.py) reads each endpoint pod's `/metrics` beside the
engines' and records what its counters grew by. The CR's totals are the operator's count of
that growth, started from the totals its status already holds (so a restarted operator, or
an endpoint pod that restarted and counts from zero, neither loses nor repeats any); a
reconcile takes what grew since the last one into the status and posts one Event for it.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from prometheus_client.parser import text_string_to_metric_families

# The endpoint's counters (longctx_endpoint/metrics.py), by the name a page gives them.
REQUESTS = "longctx_endpoint_requests_total"
CONTINUED = "longctx_endpoint_answers_continued_total"
ATTEMPTS = "longctx_endpoint_continuation_attempts_total"
GIVEN_UP = "longctx_endpoint_answers_given_up_total"
SERIES = (REQUESTS, CONTINUED, ATTEMPTS, GIVEN_UP)
# The label that splits each labelled counter.
LABEL = {REQUESTS: "route", ATTEMPTS: "reason", GIVEN_UP: "reason"}
PREFILL_ONLY = "prefill_only"
STATUS_KEYS = ("continued", "givenUp", "servedByPrefillOnly")
CR = tuple[str, str]


def page_counts(text: str) -> dict[str, float]:
    """The endpoint's counters of one page: each series summed over its labels, and each
    labelled one by label as `<series>/<value>`."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in SERIES:
                continue
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if sample.name in LABEL:
                key = f"{sample.name}/{sample.labels.get(LABEL[sample.name], '')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _by_label(grown: dict[str, float], series: str) -> str:
    parts = [f"{k.split('/', 1)[1]} {v:.0f}" for k, v in sorted(grown.items())
             if k.startswith(series + "/") and v > 0]
    return ", ".join(parts)


class Answers:
    """Each CR's answer totals and what grew since the last reconcile took them (written by
    the watch's thread, read by the reconciles')."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[CR, dict[str, float]] = {}
        self._totals: dict[CR, dict[str, int]] = {}

    def add(self, cr: CR, grown: dict[str, float]) -> None:
        """What one endpoint pod's counters grew by (an empty dict: read, nothing grew)."""
        with self._lock:
            pending = self._pending.setdefault(cr, {})
            for key, value in grown.items():
                pending[key] = pending.get(key, 0.0) + value

    def take(self, cr: CR, previous: Optional[dict[str, Any]]
             ) -> tuple[Optional[dict[str, int]], list[tuple[str, str, str]]]:
        """status.answers (None while no endpoint pod of the CR was read, and none was
        before) and the Events for what grew since the last call."""
        with self._lock:
            grown = self._pending.pop(cr, None)
            totals = self._totals.get(cr)
            if totals is None:
                if grown is None and not previous:
                    return None, []
                totals = {k: int((previous or {}).get(k, 0)) for k in STATUS_KEYS}
                self._totals[cr] = totals
            grown = grown or {}
            add = {"continued": grown.get(CONTINUED, 0.0),
                   "givenUp": grown.get(GIVEN_UP, 0.0),
                   "servedByPrefillOnly": grown.get(f"{REQUESTS}/{PREFILL_ONLY}", 0.0)}
            for key, value in add.items():
                totals[key] += int(value)
            status = dict(totals)
        events: list[tuple[str, str, str]] = []
        if add["continued"]:
            events.append(("Normal", "AnswersContinued",
                           f"{add['continued']:.0f} answers continued after their upstream "
                           f"broke (attempts: {_by_label(grown, ATTEMPTS) or 'none counted'})"
                           f"; {status['continued']} in all"))
        if add["givenUp"]:
            events.append(("Warning", "AnswersLost",
                           f"{add['givenUp']:.0f} answers given up: their clients got an error "
                           f"event and [DONE], or a 5xx ({_by_label(grown, GIVEN_UP)}); "
                           f"{status['givenUp']} in all"))
        return status, events

    def forget(self, cr: CR) -> None:
        with self._lock:
            self._pending.pop(cr, None)
            self._totals.pop(cr, None)
