// Top-k ids of each row of fp32 logits: one CTA of 1024 threads per row, radix select in
// three rounds of 11, 11 and 10 bits with shared-memory histograms.
//
// Same contract as indexer.topk_reference: ids of the k largest logits within seq_len, unordered,
// -1 past min(k, seq_len). Round 1 reads the row twice (histogram, then emit the ids above the
// threshold bin and list the ones in it); later rounds work on that list (in `scratch`), usually
// a few hundred ids. Why by hand: Triton's histogram and its one-program-per-chunk layout cost
// 118.7 us at B=64, L=64K (docs/benchmarks.md), for 16.8 MB that sit in L2.
//
// No headers: NVRTC compiles it at run time (longctx_kernels.cuda_module).

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;
constexpr int kCopies = 8;  // histogram copies, 4 warps each: fewer collisions on hot bins
constexpr int kBatch = 8;  // ids a thread reads before using any: one L2 round trip per 8

struct Shared {
  int hist[kCopies][kBins];
  int warp_sums[kWarps];
  int threshold_bin;
  int num_greater;   // ids already emitted
  int list_size[2];  // candidates in each scratch list
};

__device__ __forceinline__ unsigned ordered_key(float x) {
  const unsigned b = __float_as_uint(x);
  return (b >> 31) ? ~b : (b | 0x80000000u);
}

// Bins are numbered from the top (bin 0 = the largest digit) so that "greater" means "lower bin".
__device__ __forceinline__ int bin_of(unsigned key, int shift, int bits) {
  return (1 << bits) - 1 - (int)((key >> shift) & ((1u << bits) - 1));
}

// Appends `pos` to dst where `take` holds, one atomic per warp (all 32 lanes must call it).
__device__ __forceinline__ void warp_append(bool take, int pos, int* counter, int* dst, int limit) {
  const unsigned lanes = __ballot_sync(0xffffffffu, take);
  if (lanes == 0) return;
  const int lane = threadIdx.x & 31;
  int base = 0;
  if (lane == __ffs(lanes) - 1) base = atomicAdd(counter, __popc(lanes));
  base = __shfl_sync(0xffffffffu, base, __ffs(lanes) - 1);
  const int slot = base + __popc(lanes & ((1u << lane) - 1));
  if (take && slot < limit) dst[slot] = pos;
}

// Ids first + u * kThreads (u < kBatch) of the row or of a list, and their logits; -1 past count.
__device__ __forceinline__ void read_batch(int (&pos)[kBatch], float (&v)[kBatch], const float* __restrict__ row,
                                           const int* list, int first, int count) {
  #pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int i = first + u * kThreads;
    pos[u] = i < count ? (list ? list[i] : i) : -1;
  }
  #pragma unroll
  for (int u = 0; u < kBatch; ++u) v[u] = pos[u] >= 0 ? row[pos[u]] : 0.f;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
radix_topk_rows(const float* __restrict__ logits, const int* __restrict__ seq_lens, int* __restrict__ out,
                int* __restrict__ scratch, int max_len, int K) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.x;
  const int n = min(seq_lens[b], max_len);
  const int k_eff = min(n, K);
  const float* row = logits + (long long)b * max_len;
  int* row_out = out + (long long)b * K;
  int* lists = scratch + (long long)b * 2 * max_len;  // two lists of max_len ids: list j at lists + j * max_len

  for (int i = k_eff + tid; i < K; i += kThreads) row_out[i] = -1;
  if (tid == 0) { sh.num_greater = 0; sh.list_size[0] = 0; sh.list_size[1] = 0; }
  if (n <= K) {  // everything is selected
    for (int i = tid; i < n; i += kThreads) row_out[i] = i;
    return;
  }

  int remaining = k_eff;  // ids still to find among those sharing the k-th key's digits so far
  int src = -1;           // -1: the whole row; 0/1: a scratch list
  for (int round = 0; round < 3; ++round) {
    const int shift = round == 0 ? 21 : round == 1 ? 10 : 0;  // digits of 11, 11 and 10 bits
    const int bits = round == 2 ? 10 : 11, nbins = 1 << bits;
    for (int i = tid; i < kCopies * kBins; i += kThreads) (&sh.hist[0][0])[i] = 0;
    __syncthreads();
    int* hist = sh.hist[warp % kCopies];
    const int count = src < 0 ? n : min(sh.list_size[src], max_len);
    const int* list = src < 0 ? nullptr : lists + src * max_len;
    for (int base = 0; base < count; base += kThreads * kBatch) {
      int pos[kBatch];
      float v[kBatch];
      read_batch(pos, v, row, list, base + tid, count);
      #pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (pos[u] >= 0) atomicAdd(&hist[bin_of(ordered_key(v[u]), shift, bits)], 1);
      }
    }
    __syncthreads();
    // Sum the copies; each thread owns two adjacent bins; a block scan finds the bin where the
    // count from the top reaches `remaining`.
    int c[2];
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int bin = 2 * tid + j;
      int v = 0;
      if (bin < nbins) {
        #pragma unroll
        for (int cp = 0; cp < kCopies; ++cp) v += sh.hist[cp][bin];
      }
      c[j] = v;
    }
    int incl = c[0] + c[1];
    #pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    if (lane == 31) sh.warp_sums[warp] = incl;
    __syncthreads();
    int warp_base = 0;
    for (int w = 0; w < warp; ++w) warp_base += sh.warp_sums[w];
    const int before = warp_base + incl - c[0] - c[1];  // ids in bins above mine
    if (before < remaining && before + c[0] >= remaining) sh.threshold_bin = 2 * tid;
    else if (before + c[0] < remaining && before + c[0] + c[1] >= remaining) sh.threshold_bin = 2 * tid + 1;
    __syncthreads();
    const int tbin = sh.threshold_bin;
    const int dst = src < 0 ? 0 : 1 - src;
    if (tid == 0) sh.list_size[dst] = 0;
    __syncthreads();
    // Emit the ids above the threshold bin; list the ones in it for the next round.
    for (int base = 0; base < count; base += kThreads * kBatch) {  // uniform: warp_append needs all lanes
      int pos[kBatch];
      float v[kBatch];
      read_batch(pos, v, row, list, base + tid, count);
      #pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int bin = pos[u] >= 0 ? bin_of(ordered_key(v[u]), shift, bits) : nbins;
        warp_append(bin < tbin, pos[u], &sh.num_greater, row_out, k_eff);
        warp_append(bin == tbin, pos[u], &sh.list_size[dst], lists + dst * max_len, max_len);
      }
    }
    __syncthreads();
    remaining = k_eff - sh.num_greater;
    src = dst;
    if (sh.list_size[dst] == remaining || round == 2) {
      // All listed ids are needed, or they all share the k-th key (ties): take the first `remaining`.
      const int listed = min(sh.list_size[dst], max_len);
      for (int i = tid; i < listed; i += kThreads) {
        if (i < remaining) row_out[sh.num_greater + i] = lists[dst * max_len + i];
      }
      return;
    }
    __syncthreads();
  }
}

// Dynamic shared memory the kernel needs, read by the launcher (cuModuleGetGlobal).
extern "C" __device__ const int radix_topk_rows_shared_bytes = sizeof(Shared);
