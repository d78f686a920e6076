"""What the client-facing endpoint (longctx-endpoint) adds on the hot path, on the CPU example:
time to first token and time between tokens through the endpoint against straight through
vllm-router, side by side in one run, and each relay's CPU time per 1,000 tokens it relays;
beside them, the physical baselines of one more HTTP hop before any work of the endpoint's
own: a pass-through proxy on the endpoint's stack (benchmarks/passthrough_proxy.py) and one
in Go's net/http (benchmarks/passthrough_proxy.go), what the hop costs in a compiled
language.

A prefill engine and a decode engine, each launched as the operator renders
examples/tiny-mla-cpu.yaml (benchmarks/cpu_costs.py's launcher), vllm-router in P/D mode in
front of them, and the endpoint and both proxies in front of the router, all on 127.0.0.1.
Rounds take the paths in turn (which goes first rotates), after a warm-up round each way that
is not counted; in each, CONCURRENCY streamed greedy chat requests run at once, each prompt
its own (no prefix cache hit) and of the same length. What a path adds is each round's median
through it against the router's in the same round, a ratio a round; the figure is the median
of those ratios, with its 95% confidence interval: the engines share the machine's cores
with everything else on it, and a round's ratio spreads by more than the 2% judged. A
relay's CPU is its process's user + system time over the rounds (it is idle while the other
paths run). The figures go to build/figures/<run>/endpoint-overhead.json; `make
figures` renders docs/data-path.md's table. Exits 1 when the endpoint adds more than
MAX_ADDED to either latency.

Needs the engine environment (tools/engine-env.sh) and Go (the control plane's toolchain);
about 9 minutes on 2 cores, alone on the machine (the engines and the endpoint share its
cores):

    PYTHONPATH=core:engine:operator:. $(tools/python-env.sh)/bin/python \\
        benchmarks/endpoint_overhead.py [--rounds 300] [--max-added 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "core"), str(REPO / "operator")]

from benchmarks.cpu_costs import HOST, PORTS, launch, spec_for, wait_healthy, words  # noqa: E402
from tests.cluster.engine_smoke import CACHE  # noqa: E402
from tests.cluster.real_engines import engine_env, tiny_models  # noqa: E402
from tests.figures import Figures  # noqa: E402

ROUTER_PORT, ENDPOINT_PORT, PROXY_PORT, GO_PROXY_PORT = 18230, 18240, 18250, 18260
CONCURRENCY = 2          # the day-two traffic's: two requests at once on the 2 cores
PROMPT_WORDS = 256
ANSWER_TOKENS = 64
MAX_ADDED = 0.02         # the endpoint may add at most 2% to TTFT and to time between tokens
FIGURES = Figures("endpoint-overhead", "overhead")


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


async def wait_ready(url: str, proc: subprocess.Popen, what: str) -> None:
    async with aiohttp.ClientSession() as client:
        for _ in range(300):
            if proc.poll() is not None:
                raise SystemExit(f"{what} exited")
            try:
                async with client.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1)
    raise SystemExit(f"{what} was not ready in 300 s")


async def one(client: aiohttp.ClientSession, url: str, model: str, seed: int
              ) -> tuple[float, list[float], int]:
    """TTFT, the gaps between content chunks, and the tokens of one streamed answer."""
    body = {"model": model, "messages": [{"role": "user", "content": words(PROMPT_WORDS, seed)}],
            "max_tokens": ANSWER_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            # Every token its own content chunk: a special token the tiny models generate
            # would otherwise be streamed as nothing, and its gap go unmeasured.
            "skip_special_tokens": False}
    sent = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with client.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                arrivals.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    assert tokens == ANSWER_TOKENS, f"{url}: {tokens} tokens"
    return arrivals[0] - sent, [b - a for a, b in zip(arrivals, arrivals[1:])], tokens


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics whose
    ranks the binomial distribution of B(n, 1/2) bounds (the whole range when n is too
    small for `level`)."""
    ordered, n = sorted(values), len(values)
    tail, k = 0.0, 0
    while tail + math.comb(n, k) / 2 ** n <= (1 - level) / 2:
        tail += math.comb(n, k) / 2 ** n
        k += 1
    return (ordered[0], ordered[-1]) if k == 0 else (ordered[k - 1], ordered[n - k])


def _added(by_round: dict[str, dict[str, list[float]]], path: str, base: str, key: str
           ) -> tuple[float, list[float]]:
    """The median of the rounds' ratios of `path` to `base`, less one, and its 95% CI."""
    added = [p / b - 1 for b, p in zip(by_round[base][key], by_round[path][key])]
    return round(statistics.median(added), 4), [round(x, 4) for x in median_interval(added)]


async def measure(urls: dict[str, str], model: str, rounds: int, relays: dict[str, int]
                  ) -> dict:
    """Rounds take the paths in turn, the first one rotating from round to round. What a
    path adds is judged round by round: each round's median TTFT and median time between
    tokens through it against the router's in the same round, so that a slower stretch of
    the shared machine weighs on every side alike. `relays`: the process of each path in
    front of the router, whose CPU time per token it relayed is counted (each is idle
    while the other paths run)."""
    samples: dict[str, dict[str, list[float]]] = {
        p: {"ttft": [], "tbt": [], "ttft_first": [], "ttft_last": []} for p in urls}
    by_round: dict[str, dict[str, list[float]]] = {p: {"ttft": [], "tbt": []} for p in urls}
    tokens = dict.fromkeys(relays, 0)
    cpu_before = {path: cpu_seconds(pid) for path, pid in relays.items()}
    seed = 5000
    paths = list(urls)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as client:
        for r in range(rounds):
            for path in paths[r % len(paths):] + paths[:r % len(paths)]:
                seed += CONCURRENCY
                results = await asyncio.gather(*(one(client, urls[path], model, seed + i)
                                                 for i in range(CONCURRENCY)))
                ttfts = [ttft for ttft, _, _ in results]
                gaps = [gap for _, answer_gaps, _ in results for gap in answer_gaps]
                samples[path]["ttft"] += ttfts
                samples[path]["tbt"] += gaps
                samples[path]["ttft_first"].append(min(ttfts))
                samples[path]["ttft_last"].append(max(ttfts))
                by_round[path]["ttft"].append(statistics.median(ttfts))
                by_round[path]["tbt"].append(statistics.median(gaps))
                if path in tokens:
                    tokens[path] += sum(n for _, _, n in results)
    out: dict = {"rounds": rounds}
    for path, s in samples.items():
        out[path] = {"ttft_ms": round(statistics.median(s["ttft"]) * 1e3, 2),
                     "tbt_ms": round(statistics.median(s["tbt"]) * 1e3, 3),
                     "requests": len(s["ttft"]),
                     # A round's first and last first token: whether a relay delays every
                     # answer's, or only the one computed while the others' tokens flow.
                     "ttft_first_ms": round(statistics.median(s["ttft_first"]) * 1e3, 2),
                     "ttft_last_ms": round(statistics.median(s["ttft_last"]) * 1e3, 2)}
    for path, pid in relays.items():
        out[path]["cpu_ms_per_1000_tokens"] = round(
            (cpu_seconds(pid) - cpu_before[path]) / tokens[path] * 1e6, 1)
        for key in ("ttft", "tbt"):
            out[path][f"{key}_added"], out[path][f"{key}_added_ci95"] = _added(
                by_round, path, "router", key)
    for key in ("ttft", "tbt"):
        out["endpoint"][f"{key}_over_proxy"], out["endpoint"][f"{key}_over_proxy_ci95"] = \
            _added(by_round, "endpoint", "proxy", key)
    return out


def go_proxy() -> Path:
    """The Go pass-through proxy, built once per version of its source into the cache the
    project's other builds use (outside the tree)."""
    source = REPO / "benchmarks" / "passthrough_proxy.go"
    binary = CACHE / f"passthrough-proxy-{hashlib.sha256(source.read_bytes()).hexdigest()[:16]}"
    if not binary.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["go", "build", "-o", f"{binary}.tmp", str(source)], check=True,
                           env={**os.environ, "CGO_ENABLED": "0"})
        except FileNotFoundError:
            raise SystemExit("go is not on PATH: install Go >= 1.26 (the control plane's "
                             "toolchain, README: requirements) to build "
                             "benchmarks/passthrough_proxy.go")
        os.replace(f"{binary}.tmp", binary)
    return binary


async def run(rounds: int, logdir: Path) -> dict:
    go_binary = go_proxy()
    env_dir = engine_env()
    spec, model_dir = spec_for(tiny_models(env_dir) / "dense")
    procs = {role: launch(env_dir, spec, model_dir, role, logdir) for role in PORTS}
    try:
        for role, proc in procs.items():
            wait_healthy(f"http://{HOST}:{PORTS[role][0]}", proc, role, logdir)
        procs["router"] = start([
            str(env_dir / "bin" / "vllm-router"), "--vllm-pd-disaggregation",
            "--kv-connector", "nixl", "--policy", "cache_aware",
            "--prefill", f"http://{HOST}:{PORTS['prefill'][0]}",
            "--decode", f"http://{HOST}:{PORTS['decode'][0]}",
            "--host", HOST, "--port", str(ROUTER_PORT),
            "--prometheus-host", HOST, "--prometheus-port", str(ROUTER_PORT + 1)],
            logdir / "router.log")
        router = f"http://{HOST}:{ROUTER_PORT}"
        await wait_ready(f"{router}/readiness", procs["router"], "vllm-router")
        urls = {"router": router}

        async def relay(path: str, port: int, argv: list[str], what: str,
                        env: dict[str, str] | None = None) -> None:
            """Starts a relay in front of the router, on `port`, and waits for its /health."""
            procs[path] = start(argv, logdir / f"{path}.log", env)
            urls[path] = f"http://{HOST}:{port}"
            await wait_ready(f"{urls[path]}/health", procs[path], what)
        python = str(env_dir / "bin" / "python")
        await relay("go_proxy", GO_PROXY_PORT, [str(go_binary), str(GO_PROXY_PORT), router],
                    "the Go pass-through proxy")
        await relay("proxy", PROXY_PORT, [
            python, str(REPO / "benchmarks" / "passthrough_proxy.py"), str(PROXY_PORT), router],
            "the pass-through proxy")
        await relay("endpoint", ENDPOINT_PORT, [
            python, "-m", "longctx_endpoint.cli", "--host", HOST, "--port", str(ENDPOINT_PORT),
            "--router-url", router], "the endpoint",
            env={**os.environ, "PYTHONPATH": f"{REPO / 'core'}:{REPO / 'operator'}"})
        model = spec.model.servedName
        # One warm-up round each way: the first NIXL handshake, the first compiled shapes.
        relays = {path: procs[path].pid for path in urls if path != "router"}
        await measure(urls, model, 1, relays)
        load_before = os.getloadavg()[0]
        figures = await measure(urls, model, rounds, relays)
        # Other work on the machine shows here (the engines alone keep it near 2).
        return {**figures, "load_average": [round(load_before, 2),
                                            round(os.getloadavg()[0], 2)]}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in procs.values():
            proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--max-added", type=float, default=MAX_ADDED,
                   help="the bound to hold the endpoint to (a fraction; default the goal's)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="endpoint-overhead-") as tmp:
        figures = asyncio.run(run(args.rounds, Path(tmp)))
    case = f"tiny dense model, {CONCURRENCY} at once, {PROMPT_WORDS}-word prompts, " \
           f"{ANSWER_TOKENS} tokens"
    FIGURES.record(case, {**figures, "max_added": MAX_ADDED})
    added = figures["endpoint"]
    if max(added["ttft_added"], added["tbt_added"]) > args.max_added:
        raise SystemExit(f"the endpoint adds more than {args.max_added:.0%}: {added}")


if __name__ == "__main__":
    main()
