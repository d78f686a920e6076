"""Multi-turn sessions on two real prefill engines: does each turn find its prefix?

The package's deployment (two prefill pods, one decode pod, vllm-router; the tiny dense
model, as vLLM's CPU backend turns prefix caching off for MLA without AMX). Three sessions
of four turns (tests/cluster/sessions.py) are sent three times, each time with new first
turns so that only a session's own history is reusable:

- through vllm-router as the operator rendered it (`--policy cache_aware`);
- through the upstream endpoint picker (the GIE EPP, whose approximate prefix index llm-d's
  picker derives from) over a pool of the two prefill pods: it scrapes the engines' real
  /metrics, and the harness asks it over its ext_proc gRPC API for each request and then does
  what the decode routing sidecar does (prefill leg, then decode with the KV params);
- to a prefill pod picked at random (seeded), the prefix-blind baseline.

The prefill engines' own prefix-cache counters give each turn's hit rate. Bounded: 36 chat
requests (72 engine legs), each at most 300 s.

Then, with `spec.router.sessionAffinity: sessionId`, four sessions that name themselves
(two starting together, two one at a time, two later turns each; 12 chat requests): do they
spread over both prefill pods and stay where their prefix is?
"""

from __future__ import annotations

import json
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import yaml

from longctx_core import contract
from longctx_operator.controller.builders import picker
from tests.cluster import ext_proc
from tests.cluster.picker import picker_kubeconfig, picker_process, upstream_picker
from tests.cluster.real_engines import http_json, metrics
from tests.cluster.traffic import is_ready
from tests.cluster.sessions import (CHAT_PATH, REQUEST_TIMEOUT, Session, Turn, block_tokens,
                                    disaggregated, hit_rates_by_turn, later_turns_rate,
                                    prefix_counters, random_routing, run_sessions)
from tests.conftest import SESSION_DIR, wait_for
from tests.figures import Figures

pytestmark = pytest.mark.cluster

SESSIONS = 3
TURNS = 4
PICKER = "prefix-epp"
RANDOM_SEED = 34
ROUTINGS = ("vllm-router cache_aware", "llm-d picker (GIE EPP)", "random")
FIGURES = Figures("prefix-reuse", "prefix-reuse")
ROUTER_503_RETRIES = 12


def _picker_objects(deployment) -> str:
    """The picker's ServiceAccount with the Role the operator renders for it, and a pool of
    this CR's prefill pods (the harness plays the decode sidecar, so decode is not in it)."""
    meta = {"name": PICKER, "namespace": deployment.namespace}
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": picker.picker_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PICKER},
         "subjects": [{"kind": "ServiceAccount", "name": PICKER,
                      "namespace": deployment.namespace}]},
        {"apiVersion": picker.POOL_API_VERSION, "kind": "InferencePool", "metadata": meta,
         "spec": {"selector": {"matchLabels": contract.selector_labels(deployment.name,
                                                                       "prefill")},
                  "targetPorts": [{"number": contract.SERVING_BASE_PORT}],
                  "endpointPickerRef": {"group": "", "kind": "Service", "name": PICKER,
                                        "port": {"number": contract.PICKER_GRPC_PORT}}}},
    ]
    return "\n---\n".join(yaml.safe_dump(d) for d in docs)


def _scraped_both(log: str, prefill_pods: set[str], block: int) -> bool:
    """The picker's datastore dump shows both prefill pods with the block size it can only
    have read from the engines' /metrics (vllm:cache_config_info)."""
    dumps = [line for line in log.splitlines() if "Current Pods and metrics gathered" in line]
    return bool(dumps) and all(pod in dumps[-1] for pod in prefill_pods) and \
        dumps[-1].count(f"CacheBlockSize:{block}") >= len(prefill_pods)


def via_router(router_url: str, body: dict) -> dict:
    # vllm-router answers 503 while a starved worker's health check has timed out; such a
    # request reached no engine, so sending it again leaves the counters as they were.
    for _ in range(ROUTER_503_RETRIES):
        try:
            return http_json(f"{router_url}{CHAT_PATH}", body, REQUEST_TIMEOUT)
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                raise
            time.sleep(5)
    return http_json(f"{router_url}{CHAT_PATH}", body, REQUEST_TIMEOUT)


@pytest.fixture(scope="module")
def measured(deployment, cluster):
    """Per routing, every turn of every session; and the picker's log."""
    deployment.settle()
    prefills = deployment.urls("prefill")
    assert len(prefills) == 2, prefills
    (decode,) = deployment.urls("decode").values()
    router_url = deployment.router()
    block = block_tokens(decode)
    model = deployment.model

    results: dict[str, list[Turn]] = {}

    def run(name: str, send, base_seed: int) -> None:
        started = time.monotonic()
        try:
            results[name] = run_sessions(send, prefills, decode, model,
                                         [base_seed + 10 * s for s in range(SESSIONS)], TURNS,
                                         block)
        except Exception as exc:
            raise AssertionError(f"{name}: {exc}\n"
                                 + deployment.real.pod_logs(deployment.namespace)) from exc
        _record(name, results[name], time.monotonic() - started)

    decisions_before = _prefix_decisions(deployment)
    run(ROUTINGS[0], lambda body: via_router(router_url, body), 0)
    after = _prefix_decisions(deployment)
    router_decisions = {outcome: after[outcome] - decisions_before.get(outcome, 0.0)
                        for outcome in after}

    cluster.kubectl("apply", "-f", "-", input=_picker_objects(deployment))
    workdir = SESSION_DIR / "prefix-reuse"
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = picker_kubeconfig(cluster, deployment.namespace, PICKER, workdir)
    with picker_process(upstream_picker(), ["--v=5", "--refresh-metrics-interval=1s",
                                            "--metrics-staleness-threshold=10s"],
                        kubeconfig, deployment.namespace, PICKER, workdir) as epp, \
            grpc.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:
        epp.wait_serving()
        wait_for(lambda: _scraped_both(epp.log_path.read_text(), set(prefills), block), 60,
                 "the picker to scrape both prefill engines' /metrics")

        def via_picker(body: dict) -> dict:
            picked = ext_proc.pick(channel, CHAT_PATH, body)
            return disaggregated(f"http://{picked}", decode, body)
        run(ROUTINGS[1], via_picker, 100)
    picker_log = epp.log_path.read_text()

    run(ROUTINGS[2], random_routing(prefills, decode, RANDOM_SEED), 200)
    return results, picker_log, block, router_decisions


def _prefix_decisions(deployment) -> dict[str, float]:
    """vllm-router's own count of its prefill picks by outcome
    (`vllm_router_prefix_routing_decisions_total`): how each pick was made."""
    (pod,) = deployment.pods(contract.ROUTER_COMPONENT)
    samples = metrics(f"http://{pod['status']['podIP']}:{contract.VLLM_ROUTER_METRICS_PORT}"
                      "/metrics")
    name = "vllm_router_prefix_routing_decisions_total"
    return {key.split('outcome="', 1)[1].split('"', 1)[0]: value
            for key, value in samples.items()
            if key.partition("{")[0] == name and 'stage="prefill"' in key}


def _record(name: str, turns: list[Turn], seconds: float) -> None:
    """A routing's hit rate per turn and over the later turns, the prompt sizes of each
    turn, where decode's prompt tokens came from and which prefill pod served each
    session's turn (docs/data-path.md's table)."""
    prompts: dict[str, list[int]] = {}
    for t in turns:
        prompts.setdefault(str(t.turn), []).append(t.prompt_tokens)
    FIGURES.record(name, {
        "hit_rate_by_turn": {str(n): round(rate, 4)
                             for n, rate in hit_rates_by_turn(turns).items()},
        "later_turns_hit_rate": round(later_turns_rate(turns), 4),
        "prompt_tokens_by_turn": {n: [min(v), max(v)] for n, v in prompts.items()},
        "requests": len(turns), "seconds": round(seconds, 1),
        "decode_nixl_tokens": round(sum(t.decode["external_kv_transfer"] for t in turns)),
        "decode_own_cache_tokens": round(sum(t.decode["local_cache_hit"] for t in turns)),
        "prefill_pod_by_turn": " ".join(f"s{t.session}t{t.turn}:{t.pod[-1]}"
                                        for t in turns)})


def test_prefix_aware_routings_send_each_later_turn_to_its_prefix_holder(measured):
    results, *_ = measured
    for name in ROUTINGS[:2]:
        strays = [(t.session, t.turn, t.pod, t.holder) for t in results[name]
                  if t.turn >= 2 and t.pod != t.holder]
        assert not strays, f"{name}: turns away from the pod holding their prefix: {strays}"


def test_vllm_router_picked_no_prefill_pod_by_prefix(measured):
    """vllm-router 0.1.17's cache_aware routes a P/D request by prefix only with the prompt's
    token ids, which it cannot get from these engines: it reports every prefill pick as
    `missing_tokens` and falls back to the pod with the fewest requests in flight. Its
    sessions stayed on their pod above only because one request at a time always finds
    both pods idle and takes the first (docs/router.md)."""
    results, *_, decisions = measured
    # An outcome another module's requests created (the endpoint's continuations are
    # prompts of token ids) is a series that did not grow here.
    assert {k for k, v in decisions.items() if v} == {"missing_tokens"}, decisions
    assert decisions["missing_tokens"] >= len(results[ROUTINGS[0]]), decisions


def test_each_turn_hits_exactly_the_blocks_its_pod_holds(measured):
    """The engines' hits are the whole blocks of the session's longest earlier prompt
    that the same pod prefilled: none for a first turn or a stray turn, the previous prompt
    for a turn at its holder."""
    results, *_ = measured
    for name, turns in results.items():
        wrong = [(t.session, t.turn, t.hits, t.expected_hits) for t in turns
                 if t.hits != t.expected_hits]
        assert not wrong, f"{name}: (session, turn, hits, expected): {wrong}"


def test_prefix_aware_beats_random_by_what_the_strays_lose(measured):
    """Random's stray turns lose their whole previous prompt (in blocks); the prefix-aware
    hit rate over turns 2+ is above random's by at least that share of the queries."""
    results, _, block, _ = measured
    randomly = [t for t in results[ROUTINGS[2]] if t.turn >= 2]
    previous = {(t.session, t.turn): t.prompt_tokens for t in results[ROUTINGS[2]]}
    lost = sum(previous[(t.session, t.turn - 1)] // block * block - t.hits
               for t in randomly if t.pod != t.holder)
    margin = lost / sum(t.queries for t in randomly)
    assert margin > 0.1, f"the seeded random routing strayed too little to compare: {margin}"
    for name in ROUTINGS[:2]:
        gap = later_turns_rate(results[name]) - later_turns_rate(results[ROUTINGS[2]])
        assert gap >= 0.9 * margin, f"{name}: {gap:.3f} above random, expected {margin:.3f}"


def test_the_kv_still_moved_to_decode_over_nixl(measured):
    """Whatever the routing, decode computed none of any prompt: what it did not hold in its
    own prefix cache came over NIXL, with no failed transfer."""
    results, *_ = measured
    for name, turns in results.items():
        for t in turns:
            d = t.decode
            assert d["nixl_failed"] == 0 and d["external_kv_transfer"] > 0, (name, t)
            assert d["local_compute"] == 0, (name, t)
            assert d["external_kv_transfer"] + d["local_cache_hit"] == t.prompt_tokens, (name, t)


def test_the_picker_routed_on_the_engines_metrics(measured):
    _, log, *_ = measured
    assert "forbidden" not in log.lower(), log[-3000:]
    assert "Found cached servers" in log, "the picker's prefix index never matched a turn"


def test_the_measured_router_is_the_one_the_operator_rendered(deployment):
    """What was measured is the rendered policy: vllm-router 0.1.17 applies `--policy` to the
    prefill and the decode pick unless `--prefill-policy` / `--decode-policy` override it."""
    (dep,) = [d for d in json.loads(deployment.real.cp.kubectl(
        "get", "deployments", "-n", deployment.namespace, "-o", "json").stdout)["items"]
        if d["metadata"]["name"] == contract.vllm_router(deployment.name)]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert "--prefill-policy" not in args and "--decode-policy" not in args


# ---------------------------------------------------------------- sessions that arrive together


SESSION_AFFINITY = {"router": {"sessionAffinity": "sessionId"}}


def _router_policy(deployment) -> str | None:
    """The --policy of the one Ready router pod (None while a rollout has two, or none)."""
    pods = deployment.pods(contract.ROUTER_COMPONENT)
    if len(pods) != 1 or not is_ready(pods[0]):
        return None
    args = pods[0]["spec"]["containers"][0]["args"]
    return args[args.index("--policy") + 1]


@pytest.fixture(scope="module")
def named_sessions(deployment):
    """Agents that name their sessions (the OpenAI `user` field), with
    `spec.router.sessionAffinity: sessionId` applied (the modules after this one keep it):
    the first turns of two new sessions sent together, then of two more one at a time, then
    two later turns of each, one request at a time. Per later turn, the prefill pod whose
    counters moved and its hits."""
    deployment.apply(SESSION_AFFINITY)
    wait_for(lambda: _router_policy(deployment) == "sticky_least_loaded", 180,
             "the router rolled to sticky_least_loaded")
    deployment.settle()
    prefills = deployment.urls("prefill")
    router_url = deployment.router()
    sessions = [Session(seed) for seed in (400, 410, 420, 430)]

    def body(i: int) -> dict:
        return dict(sessions[i].body(deployment.model), user=f"agent-{i}")

    def answered(i: int, answer: dict) -> None:
        sessions[i].messages.append({"role": "assistant",
                                     "content": answer["choices"][0]["message"]["content"]})
    for session in sessions:
        session.ask(1)
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda i: via_router(router_url, body(i)), (0, 1)))
    answers += [via_router(router_url, body(i)) for i in (2, 3)]
    first = [a["usage"]["prompt_tokens"] for a in answers]
    for i, answer in enumerate(answers):
        answered(i, answer)
    placed: dict[int, list[tuple[str, float]]] = {i: [] for i in range(len(sessions))}
    for turn in (2, 3):
        for i, session in enumerate(sessions):
            session.ask(turn)
            before = {pod: prefix_counters(url) for pod, url in prefills.items()}
            answer = via_router(router_url, body(i))
            moved = {pod: (after[0] - before[pod][0], after[1] - before[pod][1])
                     for pod, after in ((p, prefix_counters(u)) for p, u in prefills.items())}
            ((pod, (_, hits)),) = [(p, d) for p, d in moved.items() if d[0]]
            placed[i].append((pod, hits))
            answered(i, answer)
    (decode,) = deployment.urls("decode").values()
    return placed, first, block_tokens(decode)


def test_named_sessions_spread_over_both_pods_and_stay(named_sessions):
    """Sessions land on both prefill pods, together or one at a time, and each later turn
    goes where its session's prefix is (its second turn hits all of its first turn's whole
    blocks there). With the default `prefix` affinity vllm-router 0.1.17 puts sessions that
    arrive one at a time on one pod (docs/router.md)."""
    placed, first, block = named_sessions
    pods = {turns[0][0] for turns in placed.values()}
    assert len(pods) == 2, f"every session on one prefill pod: {placed}"
    for i, turns in placed.items():
        assert len({pod for pod, _ in turns}) == 1, f"session {i} moved: {turns}"
        assert turns[0][1] == first[i] // block * block > 0, (i, turns, first[i])
