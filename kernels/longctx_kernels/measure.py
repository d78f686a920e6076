"""Node ceilings measured with CUDA events (HBM copy, pinned PCIe copies, NCCL all-gather), and the
comparisons the GPU checks judge kernels by."""

from __future__ import annotations

import math
import os
import socket
import statistics
from typing import Callable, Sequence

import torch


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64; NaN anywhere in `actual` gives inf."""
    a, e = actual.double(), expected.double()
    return float("inf") if torch.isnan(a).any() else ((a - e).norm() / e.norm()).item()


def exact_topk(logits: torch.Tensor, ids: torch.Tensor) -> bool:
    """Full-length rows: each row's ids are distinct and their logits are its k largest (ties in any order)."""
    k = ids.shape[1]
    return torch.equal(torch.gather(logits, 1, ids.long()).sort(dim=1).values,
                       torch.topk(logits, k, dim=1).values.sort(dim=1).values) and \
        all(ids[b].unique().numel() == k for b in range(ids.shape[0]))


def median_ms(fn: Callable[[], object], iters: int = 20, warmup: int = 3) -> float:
    """Median CUDA-event time of fn() in milliseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def l2_bytes() -> int:
    """The current GPU's L2 cache size in bytes."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size


def cold_sets_needed(bytes_per_set: int) -> int:
    """How many distinct input sets a cold timing rotates: at least 4, and enough that the other
    sets' bytes between two calls on the same set are at least twice the L2."""
    return max(4, math.ceil(2 * l2_bytes() / max(bytes_per_set, 1)) + 1)


def cold_graph_median_ms(calls: Sequence[Callable[[], object]], bytes_per_set: int, iters: int = 20,
                         calls_per_graph: int = 40) -> float:
    """Median GPU time of one call with its inputs out of L2.

    Each of `calls` must run the same work over its own inputs (a set of `bytes_per_set` bytes,
    outputs included). The graph runs them in turn, so the bytes the other sets touch between two
    calls on one set exceed the L2, as in a decode step where every layer reads its own cache.
    graph_median_ms (one set, repeated) is the warm figure; only this one is compared with an HBM floor.
    """
    needed = cold_sets_needed(bytes_per_set)
    if len(calls) < needed:
        raise ValueError(f"cold timing got {len(calls)} input sets of {bytes_per_set / 1e6:.1f} MB; "
                         f"L2 is {l2_bytes() / 1e6:.0f} MB, so it needs at least {needed}")
    rounds = max(1, calls_per_graph // len(calls))
    order = [call for _ in range(rounds) for call in calls]
    return _graph_replay_ms(lambda: [call() for call in order], len(order), iters)


def flushed_graph_median_ms(fn: Callable[[], object], iters: int = 20, reps: int = 10) -> float:
    """A cross-check of cold_graph_median_ms on one input set: fn() after a read of three L2s
    (which evicts fn's inputs and leaves no dirty line), minus that read alone."""
    sink = torch.empty(3 * l2_bytes() // 4, dtype=torch.float32, device="cuda").normal_()
    total = torch.empty((), device="cuda")

    def flush():
        torch.sum(sink, dim=0, out=total)

    both = _graph_replay_ms(lambda: [(flush(), fn()) for _ in range(reps)], reps, iters)
    return both - _graph_replay_ms(lambda: [flush() for _ in range(reps)], reps, iters)


def graph_median_ms(fn: Callable[[], object], iters: int = 20, reps: int = 10) -> float:
    """Median GPU time of one fn() call, from replays of a CUDA graph of `reps` calls on the same
    inputs: warm, since the inputs that fit stay in L2 from one call to the next.

    Host-side launch cost (Python wrappers, Triton's launcher) stays out of the
    number: it is what a CUDA-graphed decode step pays.
    """
    return _graph_replay_ms(lambda: [fn() for _ in range(reps)], reps, iters)


def _graph_replay_ms(body: Callable[[], object], calls: int, iters: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compilation, allocations) off the capture
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return median_ms(graph.replay, iters, warmup=2) / calls


def hbm_copy_bandwidth(num_bytes: int = 2 << 30, iters: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), iters)
    return 2 * num_bytes / (ms * 1e-3)


def pinned_copy_bandwidth(num_bytes: int = 1 << 30, to_device: bool = True, iters: int = 10) -> float:
    """Pinned host <-> device copy bytes per second (one direction)."""
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    if to_device:
        ms = median_ms(lambda: dev.copy_(host, non_blocking=True), iters)
    else:
        ms = median_ms(lambda: host.copy_(dev, non_blocking=True), iters)
    return num_bytes / (ms * 1e-3)


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _all_gather_worker(rank: int, world: int, port: int, num_bytes: int, results) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        n = num_bytes // 4
        mine = torch.full((n,), float(rank + 1), device="cuda")
        gathered = torch.empty(world * n, device="cuda")
        ms = median_ms(lambda: dist.all_gather_into_tensor(gathered, mine), iters=10)
        expected = torch.arange(1, world + 1, device="cuda", dtype=torch.float32).repeat_interleave(n)
        ok = bool(torch.equal(gathered, expected))
        if rank == 0:
            # NCCL "bus bandwidth" of all-gather: each rank receives (world-1)/world of the output.
            results.put((ok, world * num_bytes * (world - 1) / world / (ms * 1e-3), ms))
    finally:
        dist.destroy_process_group()


def all_gather_bandwidth(num_bytes: int = 64 << 20) -> tuple[bool, float, float]:
    """NCCL all-gather over all visible GPUs, one process each: (correct, bus B/s, median ms)."""
    import torch.multiprocessing as mp

    # NVLink multicast (NVLS) stays off: on shared hosts it can take GPUs out of service.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    world = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_all_gather_worker, args=(world, _free_loopback_port(), num_bytes, results),
                       nprocs=world, start_method="spawn")
    return results.get()
