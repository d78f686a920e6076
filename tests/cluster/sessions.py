"""Multi-turn sessions over several prefill pods, and each prefill engine's prefix-cache hits.

Every turn of a session resends the whole conversation (the earlier user turns and the
answers) plus a new user message, as an agent does. Sessions are interleaved (turn 1 of
each, then turn 2 of each, ...), one request at a time. Around each request the harness
reads `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` on every prefill engine: the
one whose queries moved is the pod that prefilled the turn, and its hits over its queries
is the turn's hit rate. The decode engine's counters show the KV still arrived over NIXL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from tests.cluster.real_engines import http_json, kv_counters, metric, metrics, words

FIRST_WORDS = 320       # turn 1: the task
TURN_WORDS = 240        # every later turn: a tool result or a follow-up
ANSWER_TOKENS = 16
CHAT_PATH = "/v1/chat/completions"
# Each leg takes seconds; minutes only when the 2-core machine is shared with other engines.
REQUEST_TIMEOUT = 300

# body -> the answer; how a routing sends one turn.
Send = Callable[[dict], dict]


@dataclass
class Session:
    """One conversation; `seed` makes its first turn, and so every prefix, its own."""
    seed: int
    messages: list[dict] = field(default_factory=list)

    def ask(self, turn: int) -> None:
        count = FIRST_WORDS if turn == 1 else TURN_WORDS
        self.messages.append({"role": "user", "content": words(count, seed=self.seed + turn)})

    def body(self, model: str) -> dict:
        return {"model": model, "messages": list(self.messages), "max_tokens": ANSWER_TOKENS,
                "temperature": 0, "ignore_eos": True}


@dataclass
class Turn:
    session: int
    turn: int
    prompt_tokens: int
    pod: str                 # the prefill pod whose counters moved
    holder: str | None       # the pod that prefilled this session's previous turn
    queries: float
    hits: float
    expected_hits: int       # the whole blocks of this session's longest prompt on `pod`
    decode: dict[str, float]  # the decode engine's counter deltas

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries


def block_tokens(url: str) -> int:
    """The tokens per KV block an engine pages and caches by (`vllm:cache_config_info`)."""
    info = [k for k in metrics(f"{url}/metrics") if k.startswith("vllm:cache_config_info{")]
    assert info, f"{url} exports no vllm:cache_config_info"
    return int(info[0].split('block_size="', 1)[1].split('"', 1)[0])


def prefix_counters(url: str) -> tuple[float, float]:
    samples = metrics(f"{url}/metrics")
    return (metric(samples, "vllm:prefix_cache_queries_total"),
            metric(samples, "vllm:prefix_cache_hits_total"))


def remote_prefill(prefill: str, body: dict) -> dict:
    """The prefill leg the routing sidecar (or vllm-router) sends once the prefill pod is
    chosen: `max_tokens` 1 and `do_remote_decode`; returns the `kv_transfer_params` with
    which decode pulls the KV over NIXL."""
    prefill_body = dict(body, max_tokens=1, stream=False, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})
    return http_json(f"{prefill}{CHAT_PATH}", prefill_body, REQUEST_TIMEOUT)["kv_transfer_params"]


def disaggregated(prefill: str, decode: str, body: dict) -> dict:
    """A request as the sidecar serves it: the prefill leg, then decode with its params."""
    params = remote_prefill(prefill, body)
    return http_json(f"{decode}{CHAT_PATH}", dict(body, kv_transfer_params=params),
                     REQUEST_TIMEOUT)


def random_routing(prefills: dict[str, str], decode: str, seed: int) -> Send:
    """The baseline: a prefill pod uniformly at random (seeded), as a prefix-blind balancer."""
    rng = random.Random(seed)
    urls = sorted(prefills.values())
    return lambda body: disaggregated(rng.choice(urls), decode, body)


def run_sessions(send: Send, prefills: dict[str, str], decode: str, model: str,
                 seeds: list[int], turns: int, block: int) -> list[Turn]:
    """`len(seeds)` sessions of `turns` turns through `send`; `prefills` maps pod name to
    URL, `block` is the engines' KV block in tokens (prefixes are cached in whole blocks).
    Fails if a turn moved the counters of no prefill pod or of more than one."""
    sessions = [Session(seed) for seed in seeds]
    holders: dict[int, str] = {}
    longest: dict[tuple[int, str], int] = {}   # (session, pod) -> longest prompt prefilled
    out = []
    for turn in range(1, turns + 1):
        for index, session in enumerate(sessions):
            session.ask(turn)
            before = {pod: prefix_counters(url) for pod, url in prefills.items()}
            kv_before = kv_counters(decode)
            answer = send(session.body(model))
            kv_after = kv_counters(decode)
            moved = {pod: (after[0] - before[pod][0], after[1] - before[pod][1])
                     for pod, after in ((p, prefix_counters(u)) for p, u in prefills.items())}
            moved = {pod: delta for pod, delta in moved.items() if delta[0]}
            assert len(moved) == 1, f"session {index} turn {turn}: prefill counters {moved}"
            ((pod, (queries, hits)),) = moved.items()
            prompt = answer["usage"]["prompt_tokens"]
            cached = longest.get((index, pod), 0)
            out.append(Turn(index, turn, prompt, pod, holders.get(index), queries, hits,
                            cached // block * block,
                            {k: kv_after[k] - kv_before[k] for k in kv_after}))
            longest[(index, pod)] = max(cached, prompt)
            holders[index] = pod
            session.messages.append({"role": "assistant",
                                     "content": answer["choices"][0]["message"]["content"]})
    return out


def hit_rates_by_turn(turns: list[Turn]) -> dict[int, float]:
    """Hits over queries of every session's n-th turn, per n."""
    out = {}
    for n in sorted({t.turn for t in turns}):
        these = [t for t in turns if t.turn == n]
        out[n] = sum(t.hits for t in these) / sum(t.queries for t in these)
    return out


def later_turns_rate(turns: list[Turn]) -> float:
    later = [t for t in turns if t.turn >= 2]
    return sum(t.hits for t in later) / sum(t.queries for t in later)
