"""CEL offline (cel-python): what the API server and `longctx plan` agree on."""

from __future__ import annotations

import pytest

from longctx_core.api.engine_types import threads_bind_rule
from longctx_core.api import fields as api_fields
from longctx_core.api.schema import Rule


def test_matches_is_re2_search_and_literals_are_text():
    """`.matches` searches (anchors are the pattern's), `$` ends the text and `\\d` is ASCII
    as in RE2 (the API server's regular expressions), and operators inside a literal are text."""
    rule = Rule("self.matches('^a/b(!|&&|[|][|])?$') && !self.matches('c')", "{self}")
    assert rule.holds("a/b") and rule.holds("a/b&&") and rule.holds("a/b||")
    assert not rule.holds("a/b\n") and not rule.holds("a/bc") and not rule.holds("xa/b")
    assert Rule("self.matches('b')", "").holds("abc")
    assert Rule("self.matches('^[$]$')", "").holds("$")
    assert not Rule("self.matches('^\\\\d$')", "").holds("\u0663")   # ARABIC-INDIC DIGIT THREE
    assert Rule("self.matches('^\\\\d$')", "").holds("3")


@pytest.mark.parametrize("image", ["ghcr.io/longctx/engine:0.1.0", "vllm/vllm-openai:v0.33.0",
                                   "localhost:5000/a/b@sha256:" + "0" * 64, "nginx",
                                   "registry.example.com:443/team/engine_x:v1.2-rc.1"])
def test_image_rule_accepts_references(image):
    assert api_fields.image_rule("image", "x").holds(image)


@pytest.mark.parametrize("image", ["Ghcr.io/X/Y", "a b", "img;rm -rf /", "ghcr.io/x:tag\n",
                                   "é", "ghcr.io//x", "x:" + "a" * 129, "x@sha256:short", ""])
def test_image_rule_refuses_what_is_not_a_reference(image):
    assert not api_fields.image_rule("image", "x").holds(image)


@pytest.mark.parametrize("bind, holds", [("auto", True), ("nobind", True), ("0", True),
                                         ("0-3,8", True), ("0-3|4-7", True), ("", False),
                                         ("0-", False), ("cores 0", False), ("0,,1", False)])
def test_threads_bind_takes_what_vllm_reads(bind, holds):
    assert threads_bind_rule("prefill").holds(bind) is holds
