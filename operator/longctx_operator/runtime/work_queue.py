"""One delaying work queue of CR keys, with client-go's workqueue semantics: a key is queued
at most once and reconciled by at most one worker at a time; a key asked for while it runs
is queued again after that run. `add(key, delay)` asks for a run after `delay` seconds (the
earliest request wins), which serves an event (no delay), a wake-up at a time (the end of a
drain window) and a retry (`retry`: doubling back-off per key, reset by `forget`).

Each run happens in the context of the last request for its key (contextvars), where Kopf's
event poster lives.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import threading
import time
from typing import Callable, Hashable

from longctx_operator import metrics

log = logging.getLogger(__name__)


class DelayingQueue:
    def __init__(self, workers: int, handle: Callable[[Hashable], None],
                 first_retry: float = 2.0, max_retry: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._handle, self._clock = handle, clock
        self.first_retry, self.max_retry = first_retry, max_retry
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Hashable]] = []
        self._order = itertools.count()
        self._due: dict[Hashable, float] = {}       # queued keys and when they are due
        self._running: set[Hashable] = set()
        # Asked for while running: when it is due, and the last request's context.
        self._again: dict[Hashable, tuple[float, contextvars.Context]] = {}
        self._contexts: dict[Hashable, contextvars.Context] = {}
        self._failures: dict[Hashable, int] = {}
        self._retry_at: dict[Hashable, float] = {}   # when the key's pending retry is due
        self._stopping = False
        self._workers = [threading.Thread(target=self._work, name=f"reconcile-{i}", daemon=True)
                         for i in range(workers)]
        for worker in self._workers:
            worker.start()

    def add(self, key: Hashable, delay: float = 0.0) -> None:
        """A run of `key` after at most `delay` seconds."""
        with self._cond:
            self._schedule(key, self._clock() + max(delay, 0.0), contextvars.copy_context())

    def _schedule(self, key: Hashable, due: float, context: contextvars.Context) -> None:
        if key in self._running:
            earlier = self._again.get(key)
            self._again[key] = (min(earlier[0], due) if earlier else due, context)
            return
        self._contexts[key] = context
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._order), key))
        self._cond.notify()

    def retry(self, key: Hashable) -> float:
        """Queues `key` again after its back-off, doubling from first_retry up to max_retry
        with each retry that failed since its last success; returns the delay. Runs that
        fail while a retry is pending (events ran the key sooner) wait for that retry: a
        burst of events does not lengthen the back-off."""
        now = self._clock()
        with self._cond:
            pending = self._retry_at.get(key)
            if pending is not None and pending > now:
                delay = pending - now
            else:
                failures = self._failures.get(key, 0)
                self._failures[key] = failures + 1
                delay = min(self.first_retry * 2 ** failures, self.max_retry)
                self._retry_at[key] = now + delay
        self.add(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        """The key's run succeeded: its next failure starts the back-off over."""
        with self._cond:
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)

    def idle(self) -> bool:
        with self._cond:
            now = self._clock()
            return not self._running and all(due > now for due in self._due.values())

    def pending(self) -> dict[Hashable, float]:
        """Queued keys and the seconds until each is due."""
        with self._cond:
            now = self._clock()
            return {key: due - now for key, due in self._due.items()}

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _next(self) -> tuple[Hashable, float, contextvars.Context] | None:
        with self._cond:
            while not self._stopping:
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)        # superseded by an earlier request
                if self._heap and self._heap[0][0] <= self._clock():
                    due, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._running.add(key)
                    return key, due, self._contexts.pop(key)
                self._cond.wait(self._heap[0][0] - self._clock() if self._heap else None)
            return None

    def _work(self) -> None:
        while (item := self._next()) is not None:
            key, due, context = item
            metrics.RECONCILE_QUEUE_SECONDS.observe(max(self._clock() - due, 0.0))
            try:
                context.run(self._handle, key)
            except Exception:   # the handler retries its own failures; nothing stops a worker
                log.exception("run of %s failed", key)
            finally:
                with self._cond:
                    self._running.discard(key)
                    again = self._again.pop(key, None)
                    if again is not None:
                        self._schedule(key, *again)
