"""Simulated series for every metric the dashboards use, as an OpenMetrics text that
`promtool tsdb create-blocks-from openmetrics` turns into a TSDB.

One LongContextDeployment `glm` in namespace `llm` (the seed layout: one PCP8 prefill engine,
one decode pod of eight DP ranks, the endpoint picker) and the operator, over one hour in
which the concurrency steps through 8, 16, 32 and 64 users, as in the seed's sweep. The
shapes are plausible, not measured: the images show what a user will see, not how fast
longctx is. Bucket boundaries are vLLM 0.33's (vllm/v1/metrics/buckets.py, the NIXL stats).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

from longctx_operator.controller.rollout import PHASES as ROLLOUT_PHASES

START = 1767225600          # 2026-01-01T00:00:00Z, fixed so the images are reproducible
MINUTES = 60
STEP = 30                   # seconds between samples (a 30 s scrape interval)
NAMESPACE = "llm"
DEPLOYMENT = "glm"
MODEL = "glm-5.3"
DECODE_RANKS = 8
PICKER_POD = f"{DEPLOYMENT}-epp-7d9c6b5f4-q2x8z"
ENDPOINT_PODS = (f"{DEPLOYMENT}-endpoint-6f8b9c7d5-h7k2m", f"{DEPLOYMENT}-endpoint-6f8b9c7d5-p9r4t")
OPERATOR_NAMESPACE = "longctx-system"
OPERATOR_POD = "longctx-5b7d8c9f6-k4m2p"
CONCURRENCY = (8, 16, 32, 64)    # one stage per quarter hour
VARIABLES = {"namespace": NAMESPACE, "deployment": DEPLOYMENT}  # dashboard variables

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
NIXL_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
QUEUE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
PAUSE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

# The seed's figures where it gives them (29.6 tok/s per user at c64; median TTFT 0.8-0.9 s),
# smooth guesses in between.
USER_TOKENS_PER_S = (62.0, 55.0, 44.0, 29.6)
TTFT_MEDIAN_S = (0.8, 0.85, 0.9, 1.6)
HOST_POOL_USE = (0.22, 0.38, 0.63, 0.91)
HOT_BUFFER_HIT = (0.93, 0.92, 0.9, 0.86)
PROMPT_TOKENS = 60000            # mean prompt of an agentic turn
KV_BYTES_PER_TOKEN = 54728       # GLM-5.3, FP8 (the planner's figure)
TURN_SECONDS = 60.0              # a user's think-and-tool time between turns


def stage(t: float) -> int:
    return min(int((t - START) // (MINUTES * 60 / len(CONCURRENCY))), len(CONCURRENCY) - 1)


def users(t: float) -> int:
    return CONCURRENCY[stage(t)]


def requests_per_s(t: float) -> float:
    return users(t) / TURN_SECONDS


def lognormal_cdf(x: float, median: float, sigma: float) -> float:
    if x <= 0:
        return 0.0
    return 0.5 * (1 + math.erf(math.log(x / median) / (sigma * math.sqrt(2))))


@dataclass
class Family:
    name: str
    kind: str                                     # counter, gauge, histogram
    series: list[tuple[dict[str, str], Callable]] = field(default_factory=list)
    buckets: tuple[float, ...] = ()
    sigma: float = 0.5                            # histogram spread (lognormal)


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _times() -> list[int]:
    return list(range(START, START + MINUTES * 60 + 1, STEP))


def render(families: list[Family]) -> str:
    """OpenMetrics text. Counters integrate a rate, gauges sample a value, histograms
    integrate (observations/s, median) into cumulative lognormal bucket counts."""
    out: list[str] = []
    times = _times()
    for fam in families:
        out.append(f"# TYPE {fam.name} {fam.kind}")
        for labels, fn in fam.series:
            total = count = value_sum = 0.0
            cum = [0.0] * len(fam.buckets)
            for i, t in enumerate(times):
                dt = STEP if i else 0
                if fam.kind == "gauge":
                    out.append(f"{fam.name}{_labels(labels)} {fn(t):.6g} {t}")
                elif fam.kind == "counter":
                    total += fn(t) * dt
                    out.append(f"{fam.name}_total{_labels(labels)} {round(total, 3)} {t}")
                else:
                    rate, median = fn(t)
                    n = rate * dt
                    count += n
                    value_sum += n * median * math.exp(fam.sigma ** 2 / 2)
                    for j, le in enumerate(fam.buckets):
                        cum[j] += n * lognormal_cdf(le, median, fam.sigma)
                        le_text = repr(float(le))
                        out.append(f"{fam.name}_bucket{_labels({**labels, 'le': le_text})} "
                                   f"{round(cum[j])} {t}")
                    out.append(f"{fam.name}_bucket{_labels({**labels, 'le': '+Inf'})} "
                               f"{round(count)} {t}")
                    out.append(f"{fam.name}_count{_labels(labels)} {round(count)} {t}")
                    out.append(f"{fam.name}_sum{_labels(labels)} {value_sum:.6g} {t}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def _noise(seed: str, t: float, amplitude: float) -> float:
    """Deterministic jitter in [1 - amplitude, 1 + amplitude]."""
    return 1 + amplitude * (2 * random.Random(f"{seed}@{t}").random() - 1)


def engine_labels(role: str, engine: int) -> dict[str, str]:
    return {"namespace": NAMESPACE, "pod": f"{DEPLOYMENT}-{role}-0", "model_name": MODEL,
            "engine": str(engine), "job": f"{NAMESPACE}/{DEPLOYMENT}-{role}"}


def vllm_families() -> list[Family]:
    pre = [engine_labels("prefill", 0)]
    dec = [engine_labels("decode", e) for e in range(DECODE_RANKS)]

    def per(series, fn):
        return [(lab, (lambda lab: lambda t: fn(t, lab))(lab)) for lab in series]

    def share(t, lab):  # one decode rank's part of the load, a little uneven
        return _noise(lab["engine"], t, 0.15) / DECODE_RANKS

    prompt_rate = lambda t: requests_per_s(t) * PROMPT_TOKENS  # noqa: E731
    gen_rate = lambda t: users(t) * USER_TOKENS_PER_S[stage(t)]  # noqa: E731
    fams = [
        # prefill
        Family("vllm:time_to_first_token_seconds", "histogram", per(pre, lambda t, _: (
            requests_per_s(t), TTFT_MEDIAN_S[stage(t)] * _noise("ttft", t, 0.1))), TTFT_BUCKETS),
        Family("vllm:request_queue_time_seconds", "histogram", per(pre, lambda t, _: (
            requests_per_s(t), 0.02 * users(t) / 8)), REQUEST_BUCKETS, sigma=0.8),
        Family("vllm:request_prefill_time_seconds", "histogram", per(pre, lambda t, _: (
            requests_per_s(t), 0.7 * _noise("pf", t, 0.1))), REQUEST_BUCKETS),
        Family("vllm:prompt_tokens_by_source", "counter", [
            ({**pre[0], "source": source}, (lambda f: lambda t: prompt_rate(t) * f)(frac))
            for source, frac in (("local_compute", 0.12), ("local_cache_hit", 0.70),
                                 ("external_kv_transfer", 0.18))]),
        Family("vllm:prefix_cache_queries", "counter", per(pre, lambda t, _: prompt_rate(t))),
        Family("vllm:prefix_cache_hits", "counter", per(pre, lambda t, _: 0.70 * prompt_rate(t))),
        Family("vllm:external_prefix_cache_queries", "counter",
               per(pre, lambda t, _: 0.30 * prompt_rate(t))),
        Family("vllm:external_prefix_cache_hits", "counter",
               per(pre, lambda t, _: 0.18 * prompt_rate(t))),
        Family("vllm:kv_offload_cpu_cache_usage_perc", "gauge", per(pre, lambda t, _: min(
            0.95, 0.3 + 0.6 * (t - START) / (MINUTES * 60)))),
        Family("vllm:kv_offload_load_bytes", "counter", per(pre, lambda t, _: (
            0.18 * prompt_rate(t) * KV_BYTES_PER_TOKEN))),
        Family("vllm:kv_offload_store_bytes", "counter", per(pre, lambda t, _: (
            0.12 * prompt_rate(t) * KV_BYTES_PER_TOKEN))),
        # both roles
        Family("vllm:num_requests_running", "gauge",
               per(pre, lambda t, _: min(2, round(requests_per_s(t) * 1.5))) +
               per(dec, lambda t, lab: round(users(t) * share(t, lab)))),
        Family("vllm:num_requests_waiting", "gauge",
               per(pre, lambda t, _: max(0, round((users(t) - 24) / 10))) +
               per(dec, lambda t, lab: max(0, round((users(t) - 40) * share(t, lab))))),
        Family("vllm:kv_cache_usage_perc", "gauge",
               per(pre, lambda t, _: 0.2 + 0.01 * users(t)) +
               per(dec, lambda t, lab: min(0.99, 0.1 + HOST_POOL_USE[stage(t)] * 0.8
                                           * share(t, lab) * DECODE_RANKS))),
        # decode
        Family("vllm:inter_token_latency_seconds", "histogram", per(dec, lambda t, lab: (
            gen_rate(t) * share(t, lab), 1 / USER_TOKENS_PER_S[stage(t)])), ITL_BUCKETS, 0.35),
        Family("vllm:request_time_per_output_token_seconds", "histogram",
               per(dec, lambda t, lab: (requests_per_s(t) * share(t, lab),
                                        1 / USER_TOKENS_PER_S[stage(t)])), ITL_BUCKETS, 0.3),
        Family("vllm:generation_tokens", "counter",
               per(dec, lambda t, lab: gen_rate(t) * share(t, lab))),
        Family("vllm:spec_decode_num_draft_tokens", "counter",
               per(dec, lambda t, lab: gen_rate(t) * share(t, lab) / 2.99 * 3)),
        Family("vllm:spec_decode_num_accepted_tokens", "counter",
               per(dec, lambda t, lab: gen_rate(t) * share(t, lab) / 2.99 * 1.99)),
        Family("vllm:num_preemptions", "counter",
               per(dec, lambda t, lab: 0.02 * share(t, lab) * DECODE_RANKS if users(t) >= 64
                   else 0.0)),
        Family("vllm:hisparse_host_cache_usage_perc", "gauge", per(dec, lambda t, lab: min(
            0.99, HOST_POOL_USE[stage(t)] * share(t, lab) * DECODE_RANKS))),
        Family("vllm:hisparse_cache_hits", "counter", per(dec, lambda t, lab: (
            gen_rate(t) * share(t, lab) * 2048 * HOT_BUFFER_HIT[stage(t)]))),
        Family("vllm:hisparse_cache_misses", "counter", per(dec, lambda t, lab: (
            gen_rate(t) * share(t, lab) * 2048 * (1 - HOT_BUFFER_HIT[stage(t)])))),
        Family("vllm:hisparse_host_to_device_bytes", "counter", per(dec, lambda t, lab: (
            gen_rate(t) * share(t, lab) * 2048 * (1 - HOT_BUFFER_HIT[stage(t)]) * 79 * 656))),
        # NIXL: the decode ranks pull each request's KV from prefill
        Family("vllm:nixl_bytes_transferred", "histogram", per(dec, lambda t, lab: (
            requests_per_s(t) * share(t, lab), PROMPT_TOKENS * KV_BYTES_PER_TOKEN / 8)),
            NIXL_BYTES_BUCKETS, 0.6),
        Family("vllm:nixl_xfer_time_seconds", "histogram", per(dec, lambda t, lab: (
            requests_per_s(t) * share(t, lab), 0.09 * (1 + users(t) / 64))),
            NIXL_TIME_BUCKETS, 0.5),
        Family("vllm:nixl_num_failed_transfers", "counter", per(dec, lambda t, lab: (
            1 / STEP if lab["engine"] == "3" and 2460 <= t - START < 2520 else 0.0))),
        Family("vllm:nixl_num_kv_expired_reqs", "counter", per(dec, lambda t, lab: (
            1 / STEP if lab["engine"] == "5" and 3300 <= t - START < 3330 else 0.0))),
    ]
    return fams


def picker_families() -> list[Family]:
    base = {"namespace": NAMESPACE, "pod": PICKER_POD, "job": f"{NAMESPACE}/{DEPLOYMENT}-epp"}
    decode_endpoints = [{"pod_name": f"{DEPLOYMENT}-decode-0", "port": str(8000 + r)}
                        for r in range(DECODE_RANKS)]

    def pick(rank: int) -> Callable[[float], float]:
        return lambda t: requests_per_s(t) / DECODE_RANKS * _noise(f"pick{rank}", t, 0.3)

    plugins = ("prefix-cache-scorer", "queue-scorer", "kv-cache-utilization-scorer",
               "max-score-picker")
    return [
        Family("inference_extension_scheduler_attempts", "counter", [
            ({**base, **ep, "status": "success", "target_model_name": MODEL,
              "exported_namespace": NAMESPACE}, pick(i))
            for i, ep in enumerate(decode_endpoints)] + [
            ({**base, "pod_name": "", "port": "", "status": "failure", "target_model_name": MODEL,
              "exported_namespace": ""}, lambda t: 0.05 if 2460 <= t - START < 2520 else 0.0)]),
        Family("inference_extension_scheduler_e2e_duration_seconds", "histogram", [
            (base, lambda t: (requests_per_s(t), 0.0008 * (1 + users(t) / 32)))],
            SCHEDULER_BUCKETS, 0.4),
        Family("inference_extension_plugin_duration_seconds", "histogram", [
            ({**base, "extension_point": "Scorer" if "scorer" in p else "Picker",
              "plugin_type": p, "plugin_name": p},
             (lambda k: lambda t: (requests_per_s(t) * 2, 0.0001 * (k + 1)))(k))
            for k, p in enumerate(plugins)], SCHEDULER_BUCKETS, 0.4),
        Family("inference_extension_prefix_indexer_hit_ratio", "histogram", [
            (base, lambda t: (requests_per_s(t) * 2, 0.7))], RATIO_BUCKETS, 0.2),
        Family("inference_pool_ready_pods", "gauge", [
            ({**base, "name": DEPLOYMENT}, lambda t: 1 + DECODE_RANKS)]),
        Family("inference_pool_average_kv_cache_utilization", "gauge", [
            ({**base, "name": DEPLOYMENT}, lambda t: 0.1 + 0.7 * HOST_POOL_USE[stage(t)])]),
        Family("inference_pool_average_queue_size", "gauge", [
            ({**base, "name": DEPLOYMENT}, lambda t: max(0.0, (users(t) - 40) / 16))]),
        # llm-d-router: the disagg-profile-handler's decision; decider `always` disaggregates
        # every request, so decode-only stays at zero.
        Family("llm_d_epp_disagg_decision", "counter", [
            ({**base, "model_name": MODEL, "decision_type": d, "plugin_name":
              "disagg-profile-handler", "plugin_type": "disagg-profile-handler"},
             (lambda d: lambda t: requests_per_s(t) if d == "prefill-decode" else 0.0)(d))
            for d in ("prefill-decode", "decode-only")]),
    ]


def endpoint_families() -> list[Family]:
    """The client-facing endpoint's two replicas. The decode pod dies at 41 min: the answers
    it streamed are continued, and until it is Ready again (a minute) new requests are
    served by prefill alone; two answers are given up when their attempts run out."""
    def down(t: float) -> bool:
        return 2460 <= t - START < 2520

    def per_pod(fn: Callable[[float], float]) -> Callable[[float], float]:
        return lambda t: fn(t) / len(ENDPOINT_PODS)

    bases = [{"namespace": NAMESPACE, "pod": pod, "job": f"{NAMESPACE}/{DEPLOYMENT}-endpoint"}
             for pod in ENDPOINT_PODS]
    return [
        Family("longctx_endpoint_requests", "counter", [
            ({**b, "route": route}, per_pod((lambda route: lambda t: requests_per_s(t) if
                                             (route == "prefill_only") == down(t) else 0.0)
                                            (route)))
            for b in bases for route in ("pd", "prefill_only")]),
        Family("longctx_endpoint_answers_continued", "counter", [
            (b, per_pod(lambda t: users(t) / 60 if down(t) else 0.0)) for b in bases]),
        Family("longctx_endpoint_continuation_attempts", "counter", [
            ({**b, "reason": reason}, per_pod((lambda reason: lambda t: users(t) / 60 if
                                               down(t) and reason == "no_finish_reason"
                                               else 0.0)(reason)))
            for b in bases for reason in ("stream_broken", "no_finish_reason",
                                          "failed_before_first_token",
                                          "upstream_unreachable")]),
        Family("longctx_endpoint_continuation_pause_seconds", "histogram", [
            (b, lambda t: (users(t) / 120 if down(t) else 0.0, 0.6)) for b in bases],
            PAUSE_BUCKETS, 0.5),
        Family("longctx_endpoint_answers_given_up", "counter", [
            ({**b, "reason": reason}, (lambda reason: lambda t: 1 / 60 if
                                       down(t) and reason == "attempts_exhausted" else 0.0)
             (reason))
            for b in bases for reason in ("attempts_exhausted", "time_exhausted",
                                          "not_continuable", "refused")]),
    ]


def operator_families() -> list[Family]:
    base = {"namespace": OPERATOR_NAMESPACE, "pod": OPERATOR_POD,
            "job": f"{OPERATOR_NAMESPACE}/longctx"}
    rollout = lambda t: 1800 <= t - START < 2400  # noqa: E731  a spec edit rolls out
    kinds = {"StatefulSet": 2, "Service": 3, "ConfigMap": 2, "Deployment": 1,
             "InferencePool": 1, "PodDisruptionBudget": 2, "ServiceAccount": 1, "Role": 1,
             "RoleBinding": 1, "PodMonitor": 3}
    return [
        Family("longctx_reconciles", "counter", [
            ({**base, "result": "ok"}, lambda t: 0.2 if rollout(t) else 0.02),
            ({**base, "result": "refused"}, lambda t: 0.05 if 1500 <= t - START < 1800 else 0),
            ({**base, "result": "error"}, lambda t: 0.03 if 2700 <= t - START < 2820 else 0)]),
        Family("longctx_reconcile_duration_seconds", "histogram", [
            (base, lambda t: (0.2 if rollout(t) else 0.02, 0.12 if rollout(t) else 0.04))],
            RECONCILE_BUCKETS, 0.5),
        Family("longctx_reconcile_queue_seconds", "histogram", [
            (base, lambda t: (0.2 if rollout(t) else 0.02, 0.3 if rollout(t) else 0.01))],
            QUEUE_BUCKETS, 0.5),
        Family("longctx_api_writes", "counter", [
            ({**base, "kind": k, "verb": v}, (lambda k, v: lambda t: (
                0.01 if rollout(t) and v == "apply" and k in ("StatefulSet", "ConfigMap")
                else 0.02 if rollout(t) and v == "status" else 0.0))(k, v))
            for k in ("StatefulSet", "ConfigMap", "LongContextDeployment")
            for v in ("apply", "status") if (v == "status") == (k == "LongContextDeployment")]),
        Family("longctx_managed_objects", "gauge", [
            ({**base, "kind": k}, (lambda n: lambda t: n)(n)) for k, n in kinds.items()]),
        Family("longctx_deployments", "gauge", [
            ({**base, "phase": p}, (lambda p: lambda t: {
                "Ready": 0 if rollout(t) or 1500 <= t - START < 1800 else 1,
                "Progressing": 1 if rollout(t) else 0,
                "Refused": 1 if 1500 <= t - START < 1800 else 0,
                "Degraded": 0}[p])(p)) for p in ("Progressing", "Ready", "Degraded", "Refused")]),
        # A Surge rollout: the new revision loads beside the serving one, then the old one
        # drains; no role is ever without a Ready pod.
        Family("longctx_rollouts", "gauge", [
            ({**base, "phase": p}, (lambda p: lambda t: float(rollout_phase(t) == p))(p))
            for p in ROLLOUT_PHASES]),
        Family("longctx_zero_capacity_seconds", "counter", [(base, lambda t: 0.0)]),
    ]


def rollout_phase(t: float) -> str:
    offset = t - START
    return "Progressing" if 1800 <= offset < 2220 else "Draining" if 2220 <= offset < 2400 \
        else "Steady"


def families() -> list[Family]:
    return vllm_families() + picker_families() + endpoint_families() + operator_families()


def openmetrics() -> str:
    return render(families())


def window() -> tuple[int, int]:
    """The simulated time range (seconds since the epoch)."""
    return START, START + MINUTES * 60
