"""Client traffic and faults for the real-engine tests: a steady stream of streamed chat
requests through the router, what each one got, and signals to a loopback pod's engine.

A request is *failed* when it got an HTTP error, a refused connection or an error in its
stream, or was still open when the traffic stopped; it is *cut off* when its stream ended
without an error but with fewer tokens than it asked for (every request sets `ignore_eos`,
so a complete answer has exactly `max_tokens`). The tokens are the stream's own count
(`usage.completion_tokens` of its last chunk); a stream that ends before that chunk counts
its content chunks (a token may decode to none). A request's *wait* is the longest time its
client had nothing arriving: from sending it to the first chunk of the stream, between two
chunks, or from the last chunk to the end of the stream (or to its failure).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from longctx_core import contract
from tests.cluster.controlplane import ControlPlaneError
from tests.cluster.real_engines import _check_loopback, metric, metrics, words


@dataclass
class Outcome:
    started: float                      # seconds since the traffic began
    seconds: float = 0.0                # until the answer ended (or failed)
    tokens: int = 0                     # the stream's tokens (see the module's docstring)
    error: str = ""                     # HTTP status, exception or the stream's error
    wait: float = 0.0                   # the longest time nothing arrived (module docstring)
    text: str = ""                      # the answer's content
    done: bool = False                  # the stream ended with `data: [DONE]`
    token_ids: list[int] = field(default_factory=list)   # with return_token_ids
    # With top_logprobs 2: each token's log-probability over the runner-up's, which is the
    # margin of their logits (one normalizer).
    margins: list[float] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.error)


def stream_chat(url: str, model: str, prompt: str, max_tokens: int, timeout: float = 300,
                **extra: Any) -> Outcome:
    """One streamed greedy chat completion with ignore_eos (and `extra` in its body): what
    the client got."""
    target = f"{url}/v1/chat/completions"
    _check_loopback(target)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True},
                       **extra}).encode()
    req = urllib.request.Request(target, data=body,
                                 headers={"Content-Type": "application/json"})
    began = last = time.monotonic()
    out = Outcome(started=0.0)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for line in resp:
                out.done = out.done or line.startswith(b"data: [DONE]")
                if not line.startswith(b"data: {"):
                    continue
                now = time.monotonic()
                out.wait, last = max(out.wait, now - last), now
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = f"stream error: {chunk['error']}"[:300]
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        out.tokens += 1
                        out.text += content
                    out.token_ids += choice.get("token_ids") or []
                    for entry in (choice.get("logprobs") or {}).get("content") or []:
                        best = sorted((t["logprob"] for t in entry["top_logprobs"]),
                                      reverse=True)
                        out.margins.append(best[0] - best[1])
                    if choice.get("finish_reason") not in (None, "length", "stop"):
                        out.error = f"finish_reason {choice['finish_reason']}"
                if chunk.get("usage"):
                    out.tokens = chunk["usage"]["completion_tokens"]
    except urllib.error.HTTPError as exc:
        out.error = f"HTTP {exc.code}: {exc.read()[:200]!r}"
    except Exception as exc:  # a refused or reset connection, a read timeout
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    ended = time.monotonic()
    out.seconds, out.wait = ended - began, max(out.wait, ended - last)
    return out


@dataclass
class Traffic:
    """Requests started every `interval` seconds, at most `parallel` in flight (the 2-core
    machine's limit), until `max_requests` or `max_seconds`; each prompt is distinct. `url()`
    gives the router to send each request to (a Service's Ready endpoint). `stop()` waits for
    the requests in flight; one still open after its wait is counted as failed."""

    url: Callable[[], str]
    model: str
    max_tokens: int = 8
    interval: float = 0.2
    parallel: int = 2
    max_requests: int = 60
    max_seconds: float = 120
    prompt_words: int = 60
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._slots = threading.Semaphore(self.parallel)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._open: dict[int, float] = {}      # request -> when it started (traffic clock)
        self._runner = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Traffic":
        self._began = time.monotonic()
        self._runner.start()
        return self

    def _run(self) -> None:
        for i in range(self.max_requests):
            if self._stop.is_set() or time.monotonic() - self._began > self.max_seconds:
                break
            while not self._slots.acquire(timeout=0.2):
                if self._stop.is_set():
                    return
            with self._lock:
                self._open[i] = time.monotonic() - self._began
            thread = threading.Thread(target=self._one, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
            time.sleep(self.interval)

    def _one(self, i: int) -> None:
        try:
            # Distinct prompts of distinct lengths: no prefix cache hit, and per-revision
            # token sums that a request crossing revisions would unbalance.
            out = stream_chat(self.url(), self.model,
                              words(self.prompt_words + i, seed=1000 + i), self.max_tokens)
            with self._lock:
                # Gone from _open: stop() has already counted it as failed.
                if i in self._open:
                    out.started = self._open.pop(i)
                    self.outcomes.append(out)
        finally:
            self._slots.release()

    def stop(self, timeout: float = 300) -> "Traffic":
        """Starts no more requests and waits up to `timeout` s for those in flight."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        self._runner.join(timeout)
        for t in self._threads:
            t.join(max(deadline - time.monotonic(), 0))
        with self._lock:
            now = time.monotonic() - self._began
            for started in self._open.values():
                self.outcomes.append(Outcome(
                    started=started, seconds=now - started, wait=now - started,
                    error=f"still open when the traffic stopped, after {now - started:.0f} s"))
            self._open.clear()
        return self

    def summary(self) -> dict[str, Any]:
        """sent: requests started; failed and cut_off as defined in the module's docstring
        (a request open at stop() is failed); longest_wait_s: the longest wait of any request
        (the longest time a client had nothing arriving; a request open at stop() counts
        its whole time); longest_s: the longest request, end to end; errors: what the
        failed ones got."""
        done = self.outcomes
        return {"sent": len(done), "failed": sum(o.failed for o in done),
                "cut_off": sum(not o.failed and o.tokens < self.max_tokens for o in done),
                "longest_wait_s": round(max((o.wait for o in done), default=0.0), 1),
                "longest_s": round(max((o.seconds for o in done), default=0.0), 1),
                "errors": sorted({o.error[:120] for o in done if o.failed})}


def is_ready(pod: dict[str, Any]) -> bool:
    """Ready and not terminating: what a Service's endpoints would list."""
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions", []))


class ServiceEndpoint:
    """What a client reaching a Service of the CR (vllm-router's, or the endpoint's) gets,
    which the harness has no endpoints for (docs/test-harness.md): a Ready, not terminating
    pod of the `component`, the newest, the list refreshed every `period` seconds as the
    endpoints controller and kube-proxy would."""

    def __init__(self, engines: Any, namespace: str, name: str, period: float = 0.5,
                 component: str = contract.ROUTER_COMPONENT,
                 port: int = contract.VLLM_ROUTER_PORT):
        self.engines, self.namespace, self.name, self.period = engines, namespace, name, period
        self.component, self.port = component, port
        self._url = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "ServiceEndpoint":
        self.refresh()
        assert self._url, f"no Ready {self.component} pod of {self.namespace}/{self.name}"
        self._thread.start()
        return self

    def refresh(self) -> None:
        pods = self.engines.pods(self.namespace, f"app.kubernetes.io/instance={self.name},"
                                                 f"app.kubernetes.io/component={self.component}")
        ready = [p for p in pods if is_ready(p)]
        if ready:
            newest = max(ready, key=lambda p: p["metadata"]["creationTimestamp"])
            self._url = f"http://{newest['status']['podIP']}:{self.port}"

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.refresh()
            except Exception:
                continue   # the API server is busy: keep the last endpoint

    def __call__(self) -> str:
        return self._url

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


# ------------------------------------------------------------------ per-pod counters


def served(url: str) -> tuple[float, float]:
    """An engine's finished requests and their prompt tokens (vLLM's own counters)."""
    m = metrics(f"{url}/metrics")
    return (metric(m, "vllm:request_success_total"), metric(m, "vllm:prompt_tokens_total"))


class PodCounters:
    """The last `served` figures read from every Ready engine pod of a CR, by pod UID (a
    pod recreated under its name starts its counters again), with its role and revision,
    polled until stopped (a drained pod is deleted: its last figures stay). A /metrics read
    that fails while the pod is still Ready and not leaving is an error: `stop()` fails with
    it. A pod list the API server does not answer skips that poll."""

    def __init__(self, engines: Any, namespace: str, name: str, period: float = 1.0):
        self.engines, self.namespace, self.name, self.period = engines, namespace, name, period
        self.last: dict[str, tuple[str, str, float, float]] = {}   # uid -> role, rev, n, tok
        self.first: dict[str, tuple[float, float]] = {}
        self._started = False
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "PodCounters":
        self.poll()
        # A pod that turns Ready later runs an engine started since: its counters begin at
        # 0, and the router may send it a request before the next poll.
        self._started = True
        self._thread.start()
        return self

    def _serving(self) -> dict[str, dict[str, Any]]:
        """The CR's Ready, not terminating engine pods, by name."""
        return {p["metadata"]["name"]: p for p in self.engines.pods(
                    self.namespace, f"app.kubernetes.io/instance={self.name}")
                if p["metadata"]["labels"].get("app.kubernetes.io/component")
                in ("prefill", "decode") and is_ready(p)}

    def poll(self) -> None:
        for pod_name, pod in self._serving().items():
            try:
                n, tokens = served(f"http://{pod['status']['podIP']}:8000")
            except Exception as exc:
                if pod_name in self._serving():    # not a pod that left meanwhile
                    self.errors.append(f"{pod_name}: {exc}"[:300])
                continue
            labels, uid = pod["metadata"]["labels"], pod["metadata"]["uid"]
            self.first.setdefault(uid, (0.0, 0.0) if self._started else (n, tokens))
            self.last[uid] = (labels["app.kubernetes.io/component"],
                              labels["longctx.dev/pairing"], n, tokens)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.poll()
            except (ControlPlaneError, subprocess.TimeoutExpired):
                continue   # the API server is busy: the next poll reads every pod again

    def stop(self) -> "PodCounters":
        self._stop.set()
        self._thread.join(30)
        self.poll()
        assert not self.errors, f"reading the engines' /metrics failed: {self.errors}"
        return self

    def by_revision(self) -> dict[str, dict[str, tuple[float, float]]]:
        """{revision: {role: (requests, prompt tokens) served since start()}}."""
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for uid, (role, rev, n, tokens) in self.last.items():
            n0, t0 = self.first[uid]
            have = out.setdefault(rev, {}).get(role, (0.0, 0.0))
            out[rev][role] = (have[0] + n - n0, have[1] + tokens - t0)
        return out


# ------------------------------------------------------------------ faults


def engine_pid(pod: dict[str, Any]) -> int:
    """The engine container's process (leader of its process group): the loopback kubelet
    records it as the containerID, `loopback://<pid>`."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs["name"] == "engine" and (cs.get("containerID") or "").startswith("loopback://"):
            return int(cs["containerID"].removeprefix("loopback://"))
    raise AssertionError(f"pod {pod['metadata']['name']} has no running engine container")


def signal_engine(pod: dict[str, Any], sig: signal.Signals) -> None:
    """`sig` to every process of the engine container (vLLM's API server and EngineCore)."""
    os.killpg(engine_pid(pod), sig)
