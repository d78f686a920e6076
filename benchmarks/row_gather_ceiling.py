"""How fast one H200 reads the sparse-MLA decode's rows at all: 2048 random 656-byte rows of each
of 64 requests' 64K-token contexts (86 MB), copied into shared memory by a kernel that does
nothing else, with every warp keeping `depth` rows in flight (16-B cp.async, no barriers), over a
sweep of depths and grid sizes. Its best time is the ceiling for any kernel that gathers these
rows the same way; docs/benchmarks.md sets the sparse-MLA kernel's own copy time against it.

    PYTHONPATH=kernels python3 benchmarks/row_gather_ceiling.py

Slot patterns as in benchmarks/sparse_mla_cuts.py: random (decode), consecutive, shared (L2-resident).
"""

from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

import torch

from longctx_kernels import cuda_module, measure
from sparse_mla_cuts import slot_pattern  # benchmarks/ is the script's directory

CTAS_PER_SM = (1, 2, 4)

SOURCE = r"""
#ifndef DEPTH
#define DEPTH 4
#endif
constexpr int kRowBytes = 656, kWarps = 8;

extern "C" __global__ void __launch_bounds__(32 * kWarps)
gather_rows(const unsigned char* __restrict__ cache, const int* __restrict__ slots, int n, unsigned* __restrict__ sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned char* buf = smem + warp * DEPTH * kRowBytes;
  const int first = blockIdx.x * kWarps + warp, stride = gridDim.x * kWarps;
  int k = 0;
  for (int base = first * 32; base < n; base += stride * 32) {
    const int my_slot = base + lane < n ? slots[base + lane] : 0;  // a warp's next 32 rows
    for (int i = 0; i < 32 && base + i < n; ++i, ++k) {
      const unsigned char* src = cache + (long long)__shfl_sync(0xffffffffu, my_slot, i) * kRowBytes;
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(buf + (k % DEPTH) * kRowBytes));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 16 * lane), "l"(src + 16 * lane));
      if (lane < kRowBytes / 16 - 32)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 16 * (lane + 32)), "l"(src + 16 * (lane + 32)));
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      asm volatile("cp.async.wait_group %0;\n" ::"n"(DEPTH - 1) : "memory");
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncwarp();
  if (lane == 0) sink[blockIdx.x * kWarps + warp] = buf[0];
}

extern "C" __device__ const int gather_rows_shared_bytes = kWarps * DEPTH * kRowBytes;
"""


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, ctx, topk = 64, 65536, 2048
    cache = torch.randint(0, 256, (batch * ctx, 656), dtype=torch.uint8, device="cuda", generator=gen)
    n = batch * topk
    floor_us = n * 656 / measure.hbm_copy_bandwidth() * 1e6
    print(f"{n} rows, {n * 656 / 1e6:.1f} MB; HBM floor (copy bandwidth) {floor_us:.1f} us")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(max(CTAS_PER_SM) * sms * 8, dtype=torch.int32, device="cuda")  # a word a warp
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "gather_rows.cu").write_text(SOURCE)
        cuda_module.CSRC = Path(tmp)
        for name in ("random", "consecutive", "shared"):
            slots = slot_pattern(name, batch, ctx, topk, gen).flatten()
            results = []
            for depth in (2, 4, 8):
                kernel = cuda_module.load("gather_rows.cu", "gather_rows", 0, (("DEPTH", depth),))
                for ctas_per_sm in CTAS_PER_SM:
                    grid = sms * ctas_per_sm
                    args = [(cache.data_ptr(), ptr), (slots.data_ptr(), ptr), (n, i32), (sink.data_ptr(), ptr)]
                    # The stream is read at each call: a CUDA graph captures on its own.
                    ms = measure.graph_median_ms(
                        lambda: kernel.launch((grid, 1, 1), 256, args, torch.cuda.current_stream().cuda_stream))
                    results.append((ms * 1e3, depth, ctas_per_sm))
            for us, depth, ctas_per_sm in sorted(results)[:3]:
                print(f"{name:12s} depth {depth} rows a warp, {ctas_per_sm} CTAs/SM (8 warps each): {us:5.1f} us "
                      f"= {us / floor_us:.2f}x the floor, {n * 656 / us / 1e6:.2f} TB/s")


if __name__ == "__main__":
    main()
