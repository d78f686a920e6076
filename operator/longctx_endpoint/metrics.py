"""The endpoint's Prometheus metrics (served at /metrics on contract.ENDPOINT_PORT). The
operator's status and the chart's alert rules read these names."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from longctx_endpoint.upstreams import PD, PREFILL_ONLY

REQUESTS = Counter("longctx_endpoint_requests", "Answers started, by the route of their "
                   "first attempt: pd (the router) or prefill_only (no decode pod Ready).",
                   ["route"])
CONTINUED = Counter("longctx_endpoint_answers_continued", "Answers that needed at least one "
                    "continuation and completed.")
ATTEMPTS = Counter("longctx_endpoint_continuation_attempts", "Attempts to continue an answer, "
                   "by what broke the one before.", ["reason"])
PAUSE = Histogram("longctx_endpoint_continuation_pause_seconds", "From a break to the next "
                  "token sent to the client.",
                  buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
GIVEN_UP = Counter("longctx_endpoint_answers_given_up", "Answers ended with an error, by why.",
                   ["reason"])

# What broke an attempt (the ATTEMPTS label).
STREAM_BROKEN = "stream_broken"            # an error or a cut stream after tokens
NO_FINISH_REASON = "no_finish_reason"      # a stream that ended cleanly, unfinished
FAILED_BEFORE_FIRST_TOKEN = "failed_before_first_token"
UPSTREAM_UNREACHABLE = "upstream_unreachable"   # no connection, no target, a 502/503/504
BREAKS = (STREAM_BROKEN, NO_FINISH_REASON, FAILED_BEFORE_FIRST_TOKEN, UPSTREAM_UNREACHABLE)

# Why an answer was given up (the GIVEN_UP label).
ATTEMPTS_EXHAUSTED = "attempts_exhausted"
TIME_EXHAUSTED = "time_exhausted"
NOT_CONTINUABLE = "not_continuable"        # it broke after the client got part of it
REFUSED = "refused"                        # the upstream refused a continuation (4xx)
GIVE_UPS = (ATTEMPTS_EXHAUSTED, TIME_EXHAUSTED, NOT_CONTINUABLE, REFUSED)

for _reason in BREAKS:
    ATTEMPTS.labels(_reason)
for _reason in GIVE_UPS:
    GIVEN_UP.labels(_reason)
# Each answer counts one: its child is looked up once here, not on the request's path.
REQUESTS_BY_ROUTE = {route: REQUESTS.labels(route) for route in (PD, PREFILL_ONLY)}
