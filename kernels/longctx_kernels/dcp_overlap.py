"""DCP KV all-gather overlapped with the previous layer's compute, on 2 GPUs.

Per layer of an L-layer step, every rank all-gathers the layer's KV shard (fp8_ds_mla rows,
656 B/token/layer; each of the N=2 DCP ranks holds L_ctx/2 rows) into a full-context buffer, and
runs the layer's compute. The compute is a stand-in: a dense bf16 block of a 2048-token prefill
chunk (``GEMMS`` products [2048, 6144] x [6144, 10240], ~1 TFLOP per rank per layer), which keeps
the step GPU-bound (a few launches per layer against ~1.5 ms of work), so host launch jitter
does not reach the numbers. Variants, timed step by step:

  compute      compute only, no collective
  gather       all-gathers only (link time of the step)
  serial       all-gather of layer i, then compute of layer i, one stream
  overlap      all-gather of layer i+1 on a side stream while layer i computes; layer i+1's
               compute waits on its gather's event, and the gather of layer i+1 is released
               when layer i starts (one layer of look-ahead, like a double buffer)

Each NCCL setting is its own communicator (``ProcessGroupNCCL.Options().config.max_ctas``, the
per-communicator form of NCCL_MAX_CTAS / NCCL_MAX_NCHANNELS), so all settings run in one process
pair and every repetition runs every (setting, context, variant) once, in a freshly shuffled
order: drift and process-pair differences cancel. Overhead is reported two ways: ratio of medians,
and the median over repetitions of the paired ratio (variant / compute-only of the same repetition). Each step starts after a 1-element all-reduce on the compute
stream, so both ranks' start events fire together; a step's time is the max over the two ranks.
"""

from __future__ import annotations

import os
import random
import statistics

import torch

ROW_BYTES = 656
CONTEXTS = {"64K": 65536, "248K": 253952}
CHUNK, HIDDEN, FFN, GEMMS = 2048, 6144, 10240, 4
VARIANTS = ("compute", "gather", "serial", "overlap")


def _quantiles(xs):
    q = statistics.quantiles(xs, n=4)
    return statistics.median(xs), q[0], q[2]


def _worker(rank, world, port, layers, reps, warmup, channel_settings, results):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=dev)
    groups = {}
    for ch in channel_settings:
        opts = dist.ProcessGroupNCCL.Options()
        if ch is not None:
            opts.config.max_ctas = ch
            opts.config.min_ctas = 1
        groups[ch] = dist.new_group(ranks=list(range(world)), backend="nccl", pg_options=opts)

    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    gen = torch.Generator(device="cuda").manual_seed(1234)
    x = torch.randn(CHUNK, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen)
    ws = [torch.randn(HIDDEN, FFN, device="cuda", dtype=torch.bfloat16, generator=gen) / HIDDEN**0.5
          for _ in range(GEMMS)]
    ys = [torch.empty(CHUNK, FFN, device="cuda", dtype=torch.bfloat16) for _ in range(GEMMS)]

    # Every rank's shards, drawn from per-(rank, layer) seeds so the peer's can be re-made for checking.
    def shard(r, layer, rows):
        g = torch.Generator(device="cuda").manual_seed(1000 * r + layer)
        return torch.randint(0, 256, (rows * ROW_BYTES,), device="cuda", dtype=torch.uint8, generator=g)

    bufs = {}
    for name, ctx in CONTEXTS.items():
        rows = ctx // world
        local = [shard(rank, i, rows) for i in range(layers)]
        full = [torch.empty(world * rows * ROW_BYTES, device="cuda", dtype=torch.uint8) for _ in range(layers)]
        bufs[name] = (local, full, rows)

    def compute(_layer):
        for w, y in zip(ws, ys):
            torch.mm(x, w, out=y)

    def gather(g, local, full, layer):
        dist.all_gather_into_tensor(full[layer], local[layer], group=g)

    def step(variant, g, ctx):
        local, full, _ = bufs[ctx]
        if variant == "compute":
            for i in range(layers):
                compute(i)
        elif variant == "gather":
            for i in range(layers):
                gather(g, local, full, i)
        elif variant == "serial":
            for i in range(layers):
                gather(g, local, full, i)
                compute(i)
        else:  # overlap
            ready = [torch.cuda.Event() for _ in range(layers)]
            started = [torch.cuda.Event() for _ in range(layers)]
            side.wait_stream(main)
            with torch.cuda.stream(side):
                gather(g, local, full, 0)
                ready[0].record(side)
            for i in range(layers):
                main.wait_event(ready[i])
                started[i].record(main)
                if i + 1 < layers:
                    with torch.cuda.stream(side):
                        side.wait_event(started[i])
                        gather(g, local, full, i + 1)
                        ready[i + 1].record(side)
                compute(i)
            main.wait_stream(side)

    sync_t = torch.ones(1, device="cuda")

    def timed(variant, g, ctx):
        torch.cuda.synchronize()
        dist.all_reduce(sync_t)  # on the compute stream: both ranks start together
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record(main)
        step(variant, g, ctx)
        t1.record(main)
        t1.synchronize()
        return t0.elapsed_time(t1)

    # Correctness: poison the gathered buffers, run serial and overlap once, compare with the
    # shards every rank holds.
    ok = True
    for ctx, (local, full, rows) in bufs.items():
        expect = [torch.cat([shard(r, i, rows) for r in range(world)]) for i in (0, layers - 1)]
        for variant in ("serial", "overlap"):
            for f in full:
                f.fill_(0xA5)
            step(variant, groups[channel_settings[0]], ctx)
            torch.cuda.synchronize()
            ok &= torch.equal(full[0], expect[0]) and torch.equal(full[-1], expect[1])
        del expect

    combos = [(ch, ctx, v) for ch in channel_settings for ctx in CONTEXTS for v in VARIANTS]
    for _ in range(warmup):
        for ch, ctx, v in combos:
            timed(v, groups[ch], ctx)
    times = {c: [] for c in combos}
    for rep in range(reps):
        order = list(combos)
        random.Random(rep).shuffle(order)  # same seed on both ranks: same order, new every rep
        for ch, ctx, v in order:
            times[(ch, ctx, v)].append(timed(v, groups[ch], ctx))

    # Max over ranks per repetition.
    keys = list(times)
    mine = torch.tensor([times[k] for k in keys], device="cuda", dtype=torch.float64)
    per_rank = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(per_rank, mine)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    flags = torch.tensor([1.0 if ok else 0.0], device="cuda")
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    if rank == 0:
        results.put(dict(ok=bool(flags.item() == 1.0), times={k: mine[j].tolist() for j, k in enumerate(keys)},
                         rank_medians={k: [statistics.median(p[j].tolist()) for p in per_rank]
                                       for j, k in enumerate(keys)}))
    torch.cuda.synchronize()
    dist.destroy_process_group()


def run(layers=8, reps=60, warmup=3, channel_settings=(None, 4, 2), world=2):
    """Spawn `world` processes; return rows (one per setting, context, variant) and the check."""
    import torch.multiprocessing as mp

    from longctx_kernels import measure

    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off (device README)
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    os.environ.pop("NCCL_MAX_NCHANNELS", None)
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, measure._free_loopback_port(), layers, reps, warmup,
                                      tuple(channel_settings), results), nprocs=world, start_method="spawn")
    out = results.get()
    rows = []
    for (ch, cname, v), ts in out["times"].items():
        med, q1, q3 = _quantiles(ts)
        comp = out["times"][(ch, cname, "compute")]
        paired = [t / c - 1 for t, c in zip(ts, comp)]
        pm, pq1, pq3 = _quantiles(paired)
        rows.append(dict(channels=ch, context=cname, variant=v, median_ms=med, q1_ms=q1, q3_ms=q3,
                         overhead=med / statistics.median(comp) - 1, paired_overhead=pm,
                         paired_overhead_iqr=(pq1, pq3), rank_median_ms=out["rank_medians"][(ch, cname, v)],
                         n=len(ts), layers=layers, gather_bytes_per_layer=CONTEXTS[cname] * ROW_BYTES,
                         times_ms=ts))
    return rows, out["ok"]
