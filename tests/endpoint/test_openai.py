"""Which requests are continued by token ids, the continuation request, and the chunks of a
first attempt read on the hot path."""

from __future__ import annotations

import json
from typing import Any

import pytest

from longctx_endpoint.openai import (CHAT, COMPLETION, Answer, continuation_request, read_chunk,
                                     why_not_continuable)


@pytest.mark.parametrize("body,why", [
    ({"n": 2}, "n or best_of"), ({"response_format": {"type": "json_object"}}, "structured"),
    ({"guided_regex": "a+"}, "structured"), ({"tools": [{}]}, "tools"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"logprobs": True}, "logprobs"),
    ({"prompt": ["a", "b"]}, "several prompts"), ({"echo": True}, "echo"),
    ({"stream_options": {"continuous_usage_stats": True}}, "continuous usage"),
])
def test_what_cannot_be_continued_exactly_says_why(body: dict, why: str) -> None:
    assert why in why_not_continuable({"model": "m", **body})


@pytest.mark.parametrize("body", [
    {"temperature": 0}, {"response_format": {"type": "text"}}, {"tools": [{}], "tool_choice": "none"},
    {"repetition_penalty": 1.2, "frequency_penalty": 0}, {"prompt": [1, 2, 3]}, {"seed": 3},
])
def test_what_is_continued(body: dict) -> None:
    assert why_not_continuable({"model": "m", **body}) is None


def test_the_continuation_carries_the_sampling_and_what_is_left_of_the_budget() -> None:
    body = {"model": "m", "messages": [], "max_completion_tokens": 10, "min_tokens": 4,
            "temperature": 0.7, "top_k": 5, "stop": ["x"], "stream": False}
    out = continuation_request(body, [1, 2], [7, 8, 9])
    assert out == {"model": "m", "temperature": 0.7, "top_k": 5, "stop": ["x"],
                   "prompt": [1, 2, 7, 8, 9], "max_tokens": 7, "min_tokens": 1,
                   "stream": True, "return_token_ids": True,
                   "stream_options": {"include_usage": True}}


def vllm_chunk(kind: str, token: int, text: str, **choice: Any) -> bytes:
    """A chunk as vLLM writes it with return_token_ids: compact, in its models' field order."""
    obj = "chat.completion.chunk" if kind == CHAT else "text_completion"
    if kind == CHAT:
        first: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None,
                                 "finish_reason": None}
    else:
        first = {"index": 0, "text": text, "logprobs": None, "finish_reason": None,
                 "stop_reason": None, "prompt_token_ids": None}
    return json.dumps({"id": "cmpl-1", "object": obj, "created": 1, "model": "m",
                       "choices": [{**first, **choice, "token_ids": [token]}]},
                      separators=(",", ":")).encode()


def opened(kind: str, wants_ids: bool) -> Answer:
    """An answer whose first attempt's opening chunk was taken."""
    body = {"model": "m", "stream": True, "return_token_ids": wants_ids}
    answer = Answer(kind, body)
    first = {"id": "cmpl-1", "object": "x", "created": 1, "model": "m",
             "choices": [{"index": 0, "text": "", "delta": {"role": "assistant", "content": ""},
                          "prompt_token_ids": [1, 2]}], "prompt_token_ids": [1, 2]}
    answer.take(kind, b"", first, read_chunk(kind, first))
    return answer


@pytest.mark.parametrize("kind", [CHAT, COMPLETION])
@pytest.mark.parametrize("wants_ids", [True, False])
# The second text holds what the hot path looks for, as a string (JSON escapes its quotes).
@pytest.mark.parametrize("text", [" w7", '","finish_reason":null,"token_ids":[9]}]}'])
def test_a_plain_token_chunk_is_read_without_json_as_take_reads_it(kind: str, wants_ids: bool,
                                                                     text: str) -> None:
    raw = vllm_chunk(kind, 7, text)
    plain, parsed = opened(kind, wants_ids), opened(kind, wants_ids)
    chunk = json.loads(raw)
    assert plain.take_plain(raw) == parsed.take(kind, raw, chunk, read_chunk(kind, chunk))
    assert plain.generated == parsed.generated == [7]


@pytest.mark.parametrize("raw", [
    vllm_chunk(CHAT, 7, " w7", finish_reason="length", stop_reason=None),   # the last one
    vllm_chunk(CHAT, 7, " w7").replace(b"cmpl-1", b"cmpl-2"),   # another attempt's
    vllm_chunk(CHAT, 7, " w7").replace(b",", b", "),   # written another way
])
def test_any_other_chunk_is_left_to_take(raw: bytes) -> None:
    answer = opened(CHAT, False)
    assert answer.take_plain(raw) is None and answer.generated == []
