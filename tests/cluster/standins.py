"""Entrypoints that stand in, on the loopback nodes, for llm-d's images, which cannot be
built here (the Go module proxy refuses llm-d-router's modules). Each takes the container's
rendered args unchanged, as the real image's entrypoint would.

- `picker BINARY ARGS...`: the upstream Gateway API Inference Extension endpoint picker
  (tools/build-epp.sh --upstream), the code llm-d's picker derives from, with llm-d's flags
  minus `--config-file`: it cannot load llm-d's configuration (another apiVersion, llm-d's
  P/D plugins), so it runs its default scheduling. Its pool, ports, gRPC health service,
  credentials and probes are the rendered ones.
- `sidecar ARGS...`: llm-d's routing sidecar reduced to what its address contract needs: it
  listens on `--port` + rank on every address of the pod, answers `GET /health` itself (its
  probes) and forwards every other connection to `localhost:<--model-server-port + rank>`,
  where llm-d's sidecar sends every decode leg. It does not run the P/D protocol (the
  picker's prefill header is ignored).

Stdlib only: the images' environment is the test environment (docs/test-harness.md).
"""

from __future__ import annotations

import asyncio
import os
import sys


def _flag(args: list[str], name: str) -> int:
    return int(next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")))


def picker(binary: str, args: list[str]) -> None:
    kept = [a for a in args if not a.startswith("--config-file")]
    os.execv(binary, [binary, *kept])


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _sidecar(args: list[str]) -> None:
    port, model_port = _flag(args, "port"), _flag(args, "model-server-port")
    ranks = _flag(args, "data-parallel-size")

    def forward_to(target: int):
        async def handle(reader, writer):
            first = await reader.read(65536)
            if first.startswith(b"GET /health "):   # answered by the proxy itself, as llm-d's
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                writer.close()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("localhost", target)
            except OSError:
                writer.close()
                return
            up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        return handle

    servers = [await asyncio.start_server(forward_to(model_port + rank), None, port + rank)
               for rank in range(ranks)]
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str]) -> None:
    which, rest = argv[0], argv[1:]
    if which == "picker":
        picker(rest[0], rest[1:])
    elif which == "sidecar":
        asyncio.run(_sidecar(rest))
    else:
        raise SystemExit(f"unknown stand-in {which!r}: picker or sidecar")


if __name__ == "__main__":
    main(sys.argv[1:])
