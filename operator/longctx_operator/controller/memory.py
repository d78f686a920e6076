"""What the operator keeps in its memory between reconciles, in one object that the
Controller owns (runtime/main.py) and passes to each reconcile and to the engine watch:
the watch's last readings (requests in flight, fault counters, answers) and, per CR, since
when each draining pod has been idle, since when a role has had no Ready pod, and its
spec's last plan. A restarted operator starts it empty and looks again."""

from __future__ import annotations

import datetime
import time
from typing import Any

from longctx_operator import metrics
from longctx_operator.controller.answers import Answers
from longctx_operator.controller.data_path import Recorded
from longctx_operator.controller.desire import SpecPlans
from longctx_operator.controller.engine_load import IdleTracker, Loads

CR = tuple[str, str]   # (namespace, name)


class Memory:
    """The engine watch writes `loads`, `recorded` and `answers` from its thread; the
    reconciles read them, and keep the per-CR trackers (one reconcile per CR at a time)."""

    def __init__(self) -> None:
        self.loads = Loads()
        self.recorded = Recorded()
        self.answers = Answers()
        self._idle: dict[CR, IdleTracker] = {}
        self._zero_since: dict[CR, float] = {}
        self.plans = SpecPlans()

    def idle(self, cr: CR, draining: list[dict[str, Any]], now: datetime.datetime
             ) -> dict[str, float]:
        """Seconds each of the CR's draining pods has been idle, from the watch's readings
        (engine_load.IdleTracker); no engine is read here."""
        if not draining:
            self._idle.pop(cr, None)
            return {}
        return self._idle.setdefault(cr, IdleTracker()).look(draining, now, self.loads)

    def count_zero_capacity(self, cr: CR, zero: bool) -> None:
        """Adds the seconds since the last reconcile during which a role that should serve
        had no Ready pod (both ends of the interval)."""
        now = time.monotonic()
        last = self._zero_since.pop(cr, None)
        if zero:
            if last is not None:
                metrics.ZERO_CAPACITY_SECONDS.inc(now - last)
            self._zero_since[cr] = now

    def forget(self, cr: CR) -> None:
        """A deleted CR's trackers and records."""
        self._idle.pop(cr, None)
        self._zero_since.pop(cr, None)
        self.recorded.forget(cr)
        self.answers.forget(cr)
        self.plans.forget(cr)
