"""Agentic traces in the Weka format (AgentX's): synthesized, or read from a user's file.

A trace is one session: `block_size` tokens per block and a list of requests, each with `t`
(start, seconds), `in`/`out` (tokens), `hash_ids` (one id per block of the prompt; equal ids
across requests are the same text, so a shared prefix is a shared id prefix), `think_time`
and `stop`; a subagent is an entry of `type: subagent` holding its own `requests`. No text
is stored: the load generator rebuilds deterministic text per block from the ids.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BLOCK_TOKENS = 64


@dataclass(frozen=True)
class TraceParams:
    """What the synthetic generator draws (all token counts are tokens, times seconds)."""

    sessions: int = 6
    turns: int = 3
    system_prefix_tokens: int = 256    # the agent's fixed system prompt and tools
    first_turn_tokens: int = 128       # the first user message after the system prefix
    growth_per_turn_tokens: int = 128  # new context each turn (tool results, user input)
    output_tokens: int = 8             # mean; each turn draws uniformly in [out/2, out*3/2]
    think_time_s: float = 0.5          # gap between a reply and the next turn
    subagent_every: int = 0            # a subagent after every Nth turn (0: none)
    subagent_turns: int = 2
    model: str = "model"
    seed: int = 42

    def check(self) -> None:
        for name in ("sessions", "turns", "first_turn_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"trace parameter {name}={getattr(self, name)}: must be >= 1")
        for name in ("system_prefix_tokens", "growth_per_turn_tokens", "subagent_every",
                     "subagent_turns", "think_time_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"trace parameter {name}={getattr(self, name)}: must be >= 0")


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


class _Ids:
    """Fresh hash ids; a session's blocks are numbered from its own base, so two sessions
    share only the system prefix's ids."""

    def __init__(self, start: int):
        self.next = start

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _turns(rng: random.Random, p: TraceParams, ids: _Ids, context: list[int], turns: int,
           start: float, prompt_tokens: int) -> tuple[list[dict[str, Any]], float]:
    """`turns` requests, each the previous context plus its reply plus new input."""
    requests = []
    t = start
    for turn in range(turns):
        out = rng.randint(max(1, p.output_tokens // 2), max(1, p.output_tokens * 3 // 2))
        growth = p.growth_per_turn_tokens if turn else 0
        prompt_tokens += growth
        context = context + ids.take(_blocks(prompt_tokens) - len(context))
        requests.append({"t": round(t, 3), "type": "n", "model": p.model, "in": prompt_tokens,
                         "out": out, "hash_ids": list(context),
                         "think_time": p.think_time_s if turn else 0.0,
                         "stop": "end_turn" if turn == turns - 1 else "tool_use"})
        prompt_tokens += out    # the recorded reply is part of the next turn's prompt
        t += p.think_time_s + 1.0
    return requests, t


def synthesize(p: TraceParams) -> list[dict[str, Any]]:
    """`p.sessions` traces, deterministic in `p.seed`."""
    p.check()
    rng = random.Random(p.seed)
    system_blocks = _blocks(p.system_prefix_tokens) if p.system_prefix_tokens else 0
    system = list(range(1, system_blocks + 1))
    traces = []
    for s in range(p.sessions):
        ids = _Ids(1_000_000 * (s + 1))
        prompt = p.system_prefix_tokens + p.first_turn_tokens
        requests, t = _turns(rng, p, ids, system, p.turns, 0.0, prompt)
        if p.subagent_every:
            main = requests
            requests = []
            for i, req in enumerate(main):
                requests.append(req)
                if (i + 1) % p.subagent_every == 0:
                    sub, _ = _turns(rng, p, _Ids(ids.next), system, p.subagent_turns,
                                    req["t"] + 0.5, p.system_prefix_tokens + p.first_turn_tokens)
                    ids.next += 100_000
                    requests.append({"t": req["t"] + 0.5, "type": "subagent",
                                     "agent_id": f"s{s}-a{i}", "subagent_type": "task",
                                     "hash_id_scope": "local", "requests": sub})
        traces.append({"id": f"synthetic-{p.seed}-{s}", "models": [p.model],
                       "block_size": BLOCK_TOKENS, "tool_tokens": 0,
                       "system_tokens": p.system_prefix_tokens, "requests": requests,
                       "longctx_params": asdict(p)})
    return traces


def flat_requests(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Every LLM request of a trace, subagents' included, in order."""
    out = []
    for req in trace["requests"]:
        out.extend(req["requests"] if req.get("type") == "subagent" else [req])
    return out


def check_trace(trace: Any, where: str) -> None:
    """The fields the replay needs, with an error naming the field and the fix."""
    if not isinstance(trace, dict):
        raise ValueError(f"{where}: a trace must be a JSON object, got {type(trace).__name__}")
    for key in ("id", "block_size", "requests"):
        if key not in trace:
            raise ValueError(f"{where}: trace has no '{key}' (Weka traces carry id, "
                             "block_size, models and requests)")
    trace.setdefault("models", ["model"])
    for i, req in enumerate(flat_requests(trace)):
        for key in ("t", "in", "out", "hash_ids"):
            if key not in req:
                raise ValueError(f"{where}: requests[{i}] has no '{key}'")
        if req["out"] < 1:
            raise ValueError(f"{where}: requests[{i}].out={req['out']}: must be >= 1")
        req.setdefault("type", "n")
        req.setdefault("model", trace["models"][0])


def read_traces(path: str) -> list[dict[str, Any]]:
    """A JSON Lines file (one trace a line, as the published corpora are), one JSON trace,
    or a JSON list of traces."""
    text = Path(path).read_text()
    stripped = text.lstrip()
    if stripped.startswith("["):
        traces = json.loads(text)
    elif stripped.startswith("{") and "\n{" not in stripped.rstrip():
        traces = [json.loads(text)]
    else:
        traces = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not traces:
        raise ValueError(f"{path}: no traces")
    for i, trace in enumerate(traces):
        check_trace(trace, f"{path} trace {i}")
    return traces


def to_jsonl(traces: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(t, separators=(",", ":")) + "\n" for t in traces)



def corpus_of_words(vocabulary: int = 900, words: int = 20000, seed: int = 0) -> str:
    """Prompt text for a word-level tokenizer (the tiny test models'): the default corpus is
    English, which such a tokenizer maps to one unknown token, making every block equal."""
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(vocabulary)}" for _ in range(words))
