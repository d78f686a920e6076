"""The synthetic Weka trace generator and the trace reader."""

from __future__ import annotations

import json

import pytest

from longctx_operator.bench.trace import (BLOCK_TOKENS, TraceParams, flat_requests,
                                          read_traces, synthesize, to_jsonl)


def test_sessions_and_turns_as_asked_and_deterministic():
    params = TraceParams(sessions=3, turns=4, seed=7)
    traces = synthesize(params)
    assert len(traces) == 3
    assert all(len(t["requests"]) == 4 for t in traces)
    assert synthesize(params) == traces
    assert synthesize(TraceParams(sessions=3, turns=4, seed=8)) != traces


def test_each_turn_extends_the_last_turns_blocks():
    """A turn's prompt is the previous prompt, its reply and the new input: its hash ids
    start with all of the previous turn's, and cover `in` in 64-token blocks."""
    p = TraceParams(sessions=1, turns=5, growth_per_turn_tokens=200, output_tokens=10)
    turns = synthesize(p)[0]["requests"]
    for prev, cur in zip(turns, turns[1:]):
        assert cur["hash_ids"][:len(prev["hash_ids"])] == prev["hash_ids"]
        assert cur["in"] == prev["in"] + prev["out"] + p.growth_per_turn_tokens
        assert cur["t"] > prev["t"]
    for req in turns:
        assert len(req["hash_ids"]) == -(-req["in"] // BLOCK_TOKENS)
        assert p.output_tokens // 2 <= req["out"] <= p.output_tokens * 3 // 2
    assert turns[0]["think_time"] == 0 and turns[1]["think_time"] == p.think_time_s
    assert turns[-1]["stop"] == "end_turn" and turns[0]["stop"] == "tool_use"


def test_sessions_share_only_the_system_prefix():
    p = TraceParams(sessions=2, turns=2, system_prefix_tokens=256)
    a, b = (t["requests"][0]["hash_ids"] for t in synthesize(p))
    prefix = 256 // BLOCK_TOKENS
    assert a[:prefix] == b[:prefix]
    assert not set(a[prefix:]) & set(b[prefix:])


def test_subagents_are_nested_requests_with_their_own_blocks():
    p = TraceParams(sessions=1, turns=4, subagent_every=2, subagent_turns=3)
    trace = synthesize(p)[0]
    subs = [r for r in trace["requests"] if r.get("type") == "subagent"]
    assert len(subs) == 2 and all(len(s["requests"]) == 3 for s in subs)
    assert len(flat_requests(trace)) == 4 + 6
    main_ids = {h for r in trace["requests"] if r.get("type") == "n" for h in r["hash_ids"]}
    sub_ids = {h for s in subs for r in s["requests"] for h in r["hash_ids"]}
    system = set(range(1, p.system_prefix_tokens // BLOCK_TOKENS + 1))
    assert main_ids & sub_ids == system


def test_a_file_round_trips_and_bad_traces_name_the_field(tmp_path):
    traces = synthesize(TraceParams(sessions=2))
    path = tmp_path / "t.jsonl"
    path.write_text(to_jsonl(traces))
    assert read_traces(str(path)) == traces
    bad = dict(traces[0], requests=[{"t": 0, "in": 10, "hash_ids": [1]}])
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"requests\[0\] has no 'out'"):
        read_traces(str(path))
    with pytest.raises(ValueError, match="sessions=0"):
        synthesize(TraceParams(sessions=0))
