"""A real prefill/decode pair on CPU with a real NIXL KV transfer, behind vllm-router.

    python3 -m tests.cluster.engine_smoke [--model mla|dense] [--venv DIR] [--models DIR]

Starts, from the engine venv (tools/engine-env.sh), a prefill vLLM (kv_producer) and a decode
vLLM (kv_consumer) serving a tiny local model (tests/cluster/tiny_models.py), then vllm-router
in P/D mode in front of them, all on 127.0.0.1; sends one chat completion through the router
and prints the decode engine's KV-source and NIXL metrics. Exits 0 when the decode engine got
every prompt token over NIXL and computed none. Every process runs in its own process group
and is stopped by that group at the end, also on error, Ctrl-C or SIGTERM.
Standard library only: any python3 runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LONGCTX_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "longctx")
METRICS = ("prompt_tokens_by_source", "nixl_bytes_transferred", "nixl_num_failed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 5) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


class Procs:
    """Started processes, each in its own session, so a stop reaches its children too."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.logdir / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        print(f"[smoke] {name}: pid {self.procs[name].pid}, log {log.name}", flush=True)

    def tail(self, name: str, lines: int = 40) -> str:
        text = (self.logdir / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_ok(self, names: list[str], url_of: dict[str, str], timeout: float) -> None:
        """Polls each URL until 200; fails early with the log tail if a process exits."""
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            for name in list(pending):
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with {self.procs[name].returncode}:\n"
                                       + self.tail(name))
                if http(url_of[name])[0] == 200:
                    pending.remove(name)
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"not ready after {timeout:.0f} s: {pending}\n"
                                   + "\n".join(self.tail(n, 15) for n in pending))
            if pending:
                time.sleep(1)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for name, p in self.procs.items():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"[smoke] {name}: no exit after SIGTERM, killing its group", flush=True)
            try:
                os.killpg(p.pid, signal.SIGKILL)  # leftovers of the group (vLLM's workers)
            except ProcessLookupError:
                pass
            p.wait()


def engine_env(workdir: Path, core: int, side_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "UCX_"))}
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": "1",             # GiB of KV pool; whole GiB only
        "VLLM_CPU_OMP_THREADS_BIND": str(core),    # one core per engine (the machine has 2)
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
        "VLLM_HOST_IP": "127.0.0.1",               # vLLM's own distributed init, not the NIC
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
        # UCX's TCP transport listens on every interface unless told otherwise.
        "UCX_NET_DEVICES": "lo",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(workdir / "hf"),
    })
    return env


def kv_config(role: str) -> str:
    extra = {"backends": ["UCX"], "kv_lease_duration": 30}
    if role == "kv_consumer":
        extra["kv_load_failure_policy"] = "fail"   # a failed pull errors instead of recomputing
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role,
                       "kv_connector_extra_config": extra})


def metric_lines(text: str) -> list[str]:
    return [l for l in text.splitlines() if not l.startswith("#") and any(m in l for m in METRICS)]


def metric(lines: list[str], pattern: str) -> float | None:
    for line in lines:
        if re.search(pattern, line.rsplit(" ", 1)[0]):
            return float(line.rsplit(" ", 1)[1])
    return None


def interrupt(*_) -> None:
    """SIGTERM stops like Ctrl-C: through main()'s finally, which stops every group."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("mla", "dense"), default="mla")
    ap.add_argument("--venv", help="engine venv (default: tools/engine-env.sh builds/reuses it)")
    ap.add_argument("--models", type=Path, default=CACHE / "tiny-models")
    ap.add_argument("--words", type=int, default=198, help="prompt words (one token each)")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=300)
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    venv = Path(args.venv or subprocess.check_output([str(REPO / "tools/engine-env.sh")],
                                                     text=True).strip())
    out = subprocess.check_output([str(venv / "bin/python"), "-m", "tests.cluster.tiny_models",
                                   str(args.models)], cwd=REPO, text=True,
                                  stderr=subprocess.DEVNULL)
    model = dict(line.split("\t") for line in out.splitlines())[args.model]
    print(f"[smoke] venv {venv}\n[smoke] model {model} ({time.monotonic() - t0:.1f} s)",
          flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="longctx-smoke-"))
    procs = Procs(workdir)
    signal.signal(signal.SIGTERM, interrupt)
    ports = {n: free_port() for n in ("prefill", "decode", "router", "router_metrics",
                                      "prefill_side", "decode_side")}
    url = {n: f"http://127.0.0.1:{ports[n]}" for n in ("prefill", "decode", "router")}
    try:
        t_start = time.monotonic()
        for core, (name, role) in enumerate((("prefill", "kv_producer"),
                                             ("decode", "kv_consumer"))):
            procs.start(name, [
                str(venv / "bin/vllm"), "serve", model, "--served-model-name", args.model,
                "--host", "127.0.0.1", "--port", str(ports[name]),
                "--max-model-len", "2048", "--max-num-seqs", "4", "--dtype", "bfloat16",
                "--enforce-eager",  # the CPU torch.compile cache never reloads (20-45 s each)
                "--kv-transfer-config", kv_config(role),
            ], engine_env(workdir, core, ports[f"{name}_side"]))
        procs.wait_ok(["prefill", "decode"], {n: url[n] + "/health" for n in url},
                      args.start_timeout)
        t_engines = time.monotonic() - t_start
        print(f"[smoke] engines healthy after {t_engines:.1f} s", flush=True)

        t_router = time.monotonic()
        procs.start("router", [
            str(venv / "bin/vllm-router"), "--vllm-pd-disaggregation", "--kv-connector", "nixl",
            "--prefill", url["prefill"], "--decode", url["decode"], "--policy", "cache_aware",
            "--host", "127.0.0.1", "--port", str(ports["router"]),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ports["router_metrics"]),
            "--worker-startup-check-interval", "1",
        ], {k: v for k, v in os.environ.items()})
        procs.wait_ok(["router"], {"router": url["router"] + "/readiness"}, 120)
        print(f"[smoke] router ready after {time.monotonic() - t_router:.1f} s", flush=True)

        prompt = " ".join(f"w{i % 1000 + 1}" for i in range(args.words))
        t_req = time.monotonic()
        status, body = http(url["router"] + "/v1/chat/completions", {
            "model": args.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8, "temperature": 0}, timeout=args.request_timeout)
        t_request = time.monotonic() - t_req
        print(f"[smoke] router answered HTTP {status} in {t_request:.2f} s", flush=True)
        if status != 200:
            raise RuntimeError(body[:2000] + "\n" + procs.tail("router", 20))
        usage = json.loads(body)["usage"]
        print(f"[smoke] usage {usage}")

        lines = metric_lines(http(url["decode"] + "/metrics")[1])
        print("[smoke] decode /metrics:\n  " + "\n  ".join(lines))
        external = metric(lines, r'prompt_tokens_by_source_total\{.*source="external_kv_transfer"')
        local = metric(lines, r'prompt_tokens_by_source_total\{.*source="local_compute"')
        failed = metric(lines, r"nixl_num_failed_transfers_total")
        ok = external == usage["prompt_tokens"] and local == 0 and failed == 0  # None: absent
        print(f"[smoke] {'PASS' if ok else 'FAIL'}: external_kv_transfer={external} "
              f"local_compute={local} prompt_tokens={usage['prompt_tokens']} "
              f"nixl_failed={failed}; engines {t_engines:.1f} s, request {t_request:.2f} s, "
              f"total {time.monotonic() - t0:.1f} s")
        return 0 if ok else 1
    except (RuntimeError, KeyboardInterrupt) as e:
        print(f"[smoke] FAIL: {e!r}" if isinstance(e, KeyboardInterrupt) else f"[smoke] FAIL: {e}",
              file=sys.stderr)
        return 1
    finally:
        procs.stop()
        print(f"[smoke] stopped; logs in {workdir}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
