"""Which requests are continued by token ids, and the continuation request."""

from __future__ import annotations

import pytest

from longctx_endpoint.openai import continuation_request, why_not_continuable


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
