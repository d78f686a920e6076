"""The delaying work queue behind the Kopf handlers: one run per CR at a time, bursts
coalesced, runs at a time, retries with back-off."""

from __future__ import annotations

import contextvars
import threading
import time

from longctx_operator.runtime.work_queue import DelayingQueue


def wait_idle(queue: DelayingQueue, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not queue.idle():
        assert time.monotonic() < deadline, "the queue did not drain"
        time.sleep(0.01)


class Runs:
    """A handler that records each key it ran, in order, and can hold a key's run."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.hold: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}

    def __call__(self, key: tuple[str, str]) -> None:
        self.order.append(key[1])
        if key[1] in self.started:
            self.started[key[1]].set()
        if key[1] in self.hold:
            self.hold[key[1]].wait(5)


def test_requests_while_a_cr_waits_join_the_wait_and_while_it_runs_add_one_run():
    runs = Runs()
    queue = DelayingQueue(1, runs)
    runs.hold["blocker"], runs.started["blocker"] = threading.Event(), threading.Event()
    queue.add(("ns", "blocker"))                          # holds the only worker
    runs.started["blocker"].wait(5)
    for _ in range(10):                                   # all wait behind it: one run
        queue.add(("ns", "a"))
    runs.hold["blocker"].set()
    wait_idle(queue)
    assert runs.order == ["blocker", "a"]

    runs.hold["b"], runs.started["b"] = threading.Event(), threading.Event()
    queue.add(("ns", "b"))
    runs.started["b"].wait(5)
    for _ in range(10):                                   # during the run: one more after it
        queue.add(("ns", "b"))
    del runs.started["b"]
    runs.hold["b"].set()
    wait_idle(queue)
    assert runs.order == ["blocker", "a", "b", "b"]
    queue.stop()


def test_one_cr_never_runs_twice_at_once_and_other_crs_run_beside_it():
    lock = threading.Lock()
    active: dict[str, int] = {}
    most_of_one_cr, most_at_once = 0, 0

    def run(key: tuple[str, str]) -> None:
        nonlocal most_of_one_cr, most_at_once
        name = key[1]
        with lock:
            active[name] = active.get(name, 0) + 1
            most_of_one_cr = max(most_of_one_cr, active[name])
            most_at_once = max(most_at_once, sum(active.values()))
        time.sleep(0.02)
        with lock:
            active[name] -= 1

    queue = DelayingQueue(4, run)
    for i in range(50):
        queue.add(("ns", f"cr-{i % 3}"))
        time.sleep(0.002)
    wait_idle(queue)
    assert most_of_one_cr == 1, "a CR ran twice at once"
    assert most_at_once > 1, "different CRs did not run beside each other"
    queue.stop()


def test_a_failing_run_does_not_stop_the_queue():
    calls = []

    def run(key: tuple[str, str]) -> None:
        calls.append(key[1])
        if key[1] == "bad":
            raise ZeroDivisionError

    queue = DelayingQueue(1, run)
    queue.add(("ns", "bad"))
    wait_idle(queue)
    queue.add(("ns", "good"))
    wait_idle(queue)
    assert calls == ["bad", "good"]
    queue.stop()


def test_a_run_at_a_time_the_earliest_request_wins_and_an_event_comes_first():
    runs = Runs()
    queue = DelayingQueue(1, runs)
    queue.add(("ns", "later"), 30)
    queue.add(("ns", "later"), 0.2)                       # earlier: replaces the 30 s wake-up
    queue.add(("ns", "later"), 60)                        # later: ignored
    assert 0 < queue.pending()[("ns", "later")] <= 0.2
    started = time.monotonic()
    while not runs.order:
        assert time.monotonic() - started < 5
        time.sleep(0.01)
    assert runs.order == ["later"] and time.monotonic() - started >= 0.15
    wait_idle(queue)
    assert queue.pending() == {}
    queue.stop()


def test_retries_back_off_doubling_to_the_cap_and_a_success_resets_them():
    now = [0.0]
    queue = DelayingQueue(1, lambda key: None, first_retry=100, max_retry=350,
                          clock=lambda: now[0])
    key = ("ns", "a")
    delays = []
    for _ in range(4):             # each retry fails when it comes
        delays.append(queue.retry(key))
        now[0] += delays[-1]
    assert delays == [100, 200, 350, 350]
    queue.forget(key)
    assert queue.retry(key) == 100
    queue.stop()


def test_failures_while_a_retry_is_pending_do_not_lengthen_it():
    """Events run a failing key sooner than its retry: their failures wait for that retry."""
    now = [0.0]
    queue = DelayingQueue(1, lambda key: None, first_retry=100, clock=lambda: now[0])
    key = ("ns", "a")
    assert queue.retry(key) == 100
    now[0] += 30
    assert queue.retry(key) == 70          # the pending retry, not a doubled one
    now[0] += 70
    assert queue.retry(key) == 200         # that retry failed: the back-off doubles
    queue.stop()


def test_each_run_happens_in_the_context_of_its_last_request():
    where = contextvars.ContextVar("where", default="worker")
    seen = []
    gate = threading.Event()
    queue = DelayingQueue(1, lambda key: (seen.append(where.get()), gate.wait(5)))

    def request(label: str) -> None:
        where.set(label)
        queue.add(("ns", "a"))

    contextvars.copy_context().run(request, "first")
    while not seen:
        time.sleep(0.01)
    contextvars.copy_context().run(request, "during the run")
    gate.set()
    wait_idle(queue)
    assert seen == ["first", "during the run"]
    queue.stop()
