"""extraArgs' repeat check against vLLM 0.33's parser: only the flags vLLM accumulates may
be given twice, and vLLM itself keeps only the last value of any other."""

from __future__ import annotations

import argparse

from longctx_core.plan.extra_args import REPEATABLE_FLAGS


def test_the_repeatable_flags_are_vllms_append_actions(vllm):
    appended = {opt.lstrip("-") for a in vllm.parser._actions
                if isinstance(a, (argparse._AppendAction, argparse._AppendConstAction))
                for opt in a.option_strings if opt.startswith("--")}
    assert REPEATABLE_FLAGS == appended


def test_vllm_keeps_the_last_value_of_a_repeated_flag(vllm):
    args = vllm.make_parser().parse_args(["m", "--max-num-seqs", "4", "--max-num-seqs", "8"])
    assert args.max_num_seqs == 8
