"""extraArgs items that are not one argv word each, or repeat a flag, are refused offline
with the item's index (the operator turns them into Accepted=False)."""

from __future__ import annotations

import pytest

from longctx_core.plan import rules
from tests.contract.variants import spec_with


def problems_of(items: list[str], role: str = "decode") -> list[str]:
    return rules.problems(spec_with(lambda d: d["engine"].setdefault("extraArgs", {}).update(
        {role: items})))


@pytest.mark.parametrize("items, index, words", [
    (["--max-num-seqs", "4", "--max-num-seqs=8"], 2, "repeats --max-num-seqs of item 0"),
    (["--enable-chunked-prefill", "--no-enable-chunked-prefill"], 1,
     "repeats --enable-chunked-prefill"),
    (["-cc.mode=3", "--compilation-config.mode=4"], 1, "repeats --compilation-config.mode"),
    (["--max-num-seqs 4"], 0, "is not one flag"),
    (["--max-num-seqs", "4\x00"], 1, "contains a control character"),
    (["--served-model-name=x\n--trust-remote-code"], 0, "contains a control character"),
])
def test_items_that_are_not_one_word_or_repeat_a_flag_are_refused(items, index, words):
    found = [p for p in problems_of(items) if p.startswith(
        f"spec.engine.extraArgs.decode[{index}]")]
    assert any(words in p for p in found), problems_of(items)


def test_distinct_dotted_keys_and_the_append_flag_may_repeat():
    assert problems_of(["-cc.mode=3", "-cc.cudagraph_mode=PIECEWISE", "--middleware", "a",
                        "--middleware", "b"], "prefill") == []
