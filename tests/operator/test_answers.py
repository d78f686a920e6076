"""The endpoint's answer counters into status.answers and Events (answers.py): totals
carried from the status, growth added once, an Event for answers continued or lost."""

from __future__ import annotations

from longctx_operator.controller import answers

CR = ("ns", "cr")
PAGE = """# TYPE longctx_endpoint_requests counter
longctx_endpoint_requests_total{route="pd"} 10.0
longctx_endpoint_requests_total{route="prefill_only"} 3.0
# TYPE longctx_endpoint_answers_continued counter
longctx_endpoint_answers_continued_total 2.0
# TYPE longctx_endpoint_continuation_attempts counter
longctx_endpoint_continuation_attempts_total{reason="stream_broken"} 2.0
longctx_endpoint_continuation_attempts_total{reason="upstream_unreachable"} 1.0
# TYPE longctx_endpoint_answers_given_up counter
longctx_endpoint_answers_given_up_total{reason="attempts_exhausted"} 1.0
longctx_endpoint_answers_given_up_total{reason="time_exhausted"} 0.0
"""


def test_a_page_gives_each_counter_in_all_and_by_label():
    counts = answers.page_counts(PAGE)
    assert counts[answers.REQUESTS] == 13 and counts[f"{answers.REQUESTS}/prefill_only"] == 3
    assert counts[answers.CONTINUED] == 2
    assert counts[f"{answers.ATTEMPTS}/upstream_unreachable"] == 1
    assert counts[answers.GIVEN_UP] == 1


def test_no_status_until_an_endpoint_pod_was_read():
    store = answers.Answers()
    assert store.take(CR, None) == (None, [])
    store.add(CR, {})       # read; nothing grew
    assert store.take(CR, None) == ({"continued": 0, "givenUp": 0,
                                     "servedByPrefillOnly": 0}, [])


def test_growth_is_added_once_to_the_totals_the_status_holds():
    store = answers.Answers()
    previous = {"continued": 5, "givenUp": 1, "servedByPrefillOnly": 7}
    grown = {answers.CONTINUED: 2.0, f"{answers.ATTEMPTS}/stream_broken": 2.0,
             f"{answers.ATTEMPTS}/upstream_unreachable": 1.0, answers.GIVEN_UP: 1.0,
             f"{answers.GIVEN_UP}/attempts_exhausted": 1.0,
             f"{answers.REQUESTS}/prefill_only": 3.0, answers.REQUESTS: 3.0}
    store.add(CR, grown)
    status, events = store.take(CR, previous)
    assert status == {"continued": 7, "givenUp": 2, "servedByPrefillOnly": 10}
    (continued, lost) = events
    assert continued[:2] == ("Normal", "AnswersContinued")
    assert "2 answers continued" in continued[2]
    assert "stream_broken 2, upstream_unreachable 1" in continued[2] and "7 in all" in continued[2]
    assert lost[:2] == ("Warning", "AnswersLost") and "attempts_exhausted 1" in lost[2]
    # The next reconcile adds nothing, even from a status the cache has not caught up with.
    assert store.take(CR, previous) == (status, [])
