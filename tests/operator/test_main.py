"""The work queue behind the Kopf handlers: one run per CR at a time, bursts coalesced."""

from __future__ import annotations

import threading
import time

from longctx_operator.runtime.main import WorkQueue


def wait_idle(queue: WorkQueue, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not queue.idle():
        assert time.monotonic() < deadline, "the queue did not drain"
        time.sleep(0.01)


def test_requests_while_a_cr_waits_join_the_wait_and_while_it_runs_add_one_run():
    queue = WorkQueue(workers=1)
    gate, runs = threading.Event(), []
    queue.request(("ns", "blocker"), gate.wait)       # holds the only worker
    for _ in range(10):                                  # all wait behind it: one run
        queue.request(("ns", "a"), lambda: runs.append("a"))
    gate.set()
    wait_idle(queue)
    assert runs == ["a"]

    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        runs.append("slow")
        started.set()
        release.wait()

    queue.request(("ns", "b"), slow)
    started.wait(5)
    for _ in range(10):                                  # during the run: one more run after it
        queue.request(("ns", "b"), lambda: runs.append("again"))
    release.set()
    wait_idle(queue)
    assert runs == ["a", "slow", "again"]
    queue.stop()


def test_one_cr_never_runs_twice_at_once_and_other_crs_run_beside_it():
    queue = WorkQueue(workers=4)
    lock = threading.Lock()
    active: dict[str, int] = {}
    most_of_one_cr, most_at_once = 0, 0

    def run(name: str) -> None:
        nonlocal most_of_one_cr, most_at_once
        with lock:
            active[name] = active.get(name, 0) + 1
            most_of_one_cr = max(most_of_one_cr, active[name])
            most_at_once = max(most_at_once, sum(active.values()))
        time.sleep(0.02)
        with lock:
            active[name] -= 1

    for i in range(50):
        name = f"cr-{i % 3}"
        queue.request(("ns", name), lambda n=name: run(n))
        time.sleep(0.002)
    wait_idle(queue)
    assert most_of_one_cr == 1, "a CR ran twice at once"
    assert most_at_once > 1, "different CRs did not run beside each other"
    queue.stop()


def test_a_failing_run_does_not_stop_the_queue():
    queue = WorkQueue(workers=1)
    runs = []
    queue.request(("ns", "a"), lambda: 1 / 0)
    wait_idle(queue)
    queue.request(("ns", "a"), lambda: runs.append("ok"))
    wait_idle(queue)
    assert runs == ["ok"]
    queue.stop()
