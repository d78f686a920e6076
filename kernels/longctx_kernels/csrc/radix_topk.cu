// Top-k ids of each row of fp32 logits: one CTA of 1024 threads per row, a radix-style select
// whose 2048 bins are fitted to the keys' range in each round.
//
// Same contract as indexer.topk_reference: ids of the k largest logits within seq_len, unordered,
// -1 past min(k, seq_len). Logits are finite or -inf (the indexer's are); a NaN is never listed
// by step 1, which compares floats.
//
// 1. A sample of 8192 logits (2048 float4 chunks spread over the row) gives a threshold key tau:
//    about 1.5 times as many keys of the sample lie above it as the top k would hold. One pass
//    over the row lists every id whose key is >= tau, typically 1.5-3x k of them, in shared
//    memory (TOPK_LIST_CAP entries; no global scratch, whatever the row length). If fewer than k are
//    listed, the sample misled, and the rounds below start from the whole row.
// 2. Rounds: bin each listed key by its distance below the list's largest key,
//    (key_hi - key) >> shift, with shift chosen so that the list's range fills the 2048 bins. The
//    binning is monotone, so the ids in bins above the one holding the k-th largest are selected,
//    and that bin's ids form the next list. Each round narrows the range by 2^11; a list whose
//    keys are all equal, or all needed, ends the select (ties: the first ones listed), and a list
//    of at most 128 entries is finished by ranking each entry against the others. Usually one
//    round runs. A list that would overflow shared memory (ties, or k near the capacity) is kept
//    as what it is, the row's keys within a range, and its rounds re-read the row.
// Fixed radix digits (the previous version's top 11 bits first) put all logits of one sign and
// exponent into a few bins: hot shared-memory atomics and a first list of a quarter of the row.
// Reading the row once instead of twice (histogram, then emit) halves the per-element work, and
// a thread appends its picks of a whole batch at once (one warp scan, one atomic), since nearly
// every warp holds a pick: a ballot and an atomic per key cost ~50 instructions a key.
//
// Why by hand: Triton's histogram costs 118.7 us at B=64, L=64K (docs/benchmarks.md).
// No headers: NVRTC compiles it at run time (longctx_kernels.cuda_module).

#ifndef TOPK_ROW_BATCH
#define TOPK_ROW_BATCH 4
#endif
#ifndef TOPK_LIST_CAP
#define TOPK_LIST_CAP 8192
#endif

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBinBits = 11;
constexpr int kBins = 1 << kBinBits;
constexpr int kCopies = 4;                 // histogram copies, for hot bins (ties)
constexpr int kBatch = TOPK_ROW_BATCH;     // row chunks (float4) a thread loads before using any
constexpr int kListBatch = 8;              // list entries a thread loads before using any
constexpr int kSamplePerThread = 2;        // sampled chunks a thread
constexpr int kRankSelectMax = 128;        // lists this short are finished by ranking
constexpr int kListCap = TOPK_LIST_CAP;    // entries a shared-memory list holds
constexpr unsigned kFull = 0xffffffffu;
constexpr unsigned kLowestFiniteKey = 0x00800000u;  // ordered_key(-FLT_MAX)

static_assert(kWarps == 32, "find_threshold_bin scans the warps' sums in one warp");

struct Shared {
  int hist[kCopies][kBins];
  uint2 list[2][kListCap];  // (key, id) entries
  int warp_sums[kWarps];
  int threshold_bin;
  int num_greater;          // ids already emitted
  int list_size[2];         // entries meant for each list (more than kListCap: it overflowed)
  int sampled;              // keys in the sample
  unsigned key_lo, key_hi;  // the next round's key range
};

// fp32 -> uint32 with the same order (negatives flipped, positives above them).
__device__ __forceinline__ unsigned ordered_key(float x) {
  const unsigned b = __float_as_uint(x);
  return b ^ ((unsigned)((int)b >> 31) | 0x80000000u);
}

// Bin 0 holds the largest keys, so "greater" means "lower bin".
__device__ __forceinline__ int bin_of(unsigned key, unsigned key_hi, int shift) {
  return key >= key_hi ? 0 : (int)min((key_hi - key) >> shift, (unsigned)(kBins - 1));
}

// Inverse of ordered_key.
__device__ __forceinline__ float key_float(unsigned key) {
  return __uint_as_float(key & 0x80000000u ? key ^ 0x80000000u : ~key);
}

// A thread's batch: key(i) for the unrolled loops, bit i of `valid` says whether it is one, and
// entry(i) re-reads (key, id) for a runtime i (through L1; indexing the registers at run time would
// put them in local memory).
struct RowBatch {  // kBatch float4 chunks of the row, base + u * kThreads; -inf in chunks past n
  static constexpr int kSize = 4 * kBatch;
  const float* row;
  float x[kSize];
  unsigned valid;
  int base;
  __device__ __forceinline__ int pos(int i) const { return 4 * (base + (i / 4) * kThreads) + i % 4; }
  __device__ __forceinline__ unsigned key(int i) const { return ordered_key(x[i]); }
  __device__ __forceinline__ uint2 entry(int i) const { return make_uint2(ordered_key(row[pos(i)]), pos(i)); }
};
struct ListBatch {  // kListBatch entries (key, id) of a shared-memory list, base + u * kThreads
  static constexpr int kSize = kListBatch;
  const uint2* list;
  unsigned keys[kSize];
  unsigned valid;
  int base;
  __device__ __forceinline__ unsigned key(int i) const { return keys[i]; }
  __device__ __forceinline__ uint2 entry(int i) const { return list[base + i * kThreads]; }
};

// Logits 4c .. 4c+3 of the row: one 16-B load when the row allows it (the last chunk may then
// hold logits past n: `valid` masks them); -inf for chunks past n. No test on the loaded values
// here, so that a thread's loads all issue before the first returns.
__device__ __forceinline__ float4 load_chunk(const float* __restrict__ row, int c, int n, bool vec4) {
  const float pad = -__int_as_float(0x7f800000);
  float4 v = make_float4(pad, pad, pad, pad);
  const int p = 4 * c;
  if (p >= n) return v;
  if (vec4) return reinterpret_cast<const float4*>(row)[c];
  v.x = row[p];
  if (p + 1 < n) v.y = row[p + 1];
  if (p + 2 < n) v.z = row[p + 2];
  if (p + 3 < n) v.w = row[p + 3];
  return v;
}

// Calls f(batch) for each RowBatch of the row, valid marking the keys in [lo, hi]; all threads
// make the same number of calls.
template <class F>
__device__ __forceinline__ void for_row(const float* __restrict__ row, int n, bool vec4, unsigned lo, unsigned hi,
                                        F f) {
  const int chunks = (n + 3) >> 2;
  for (int base = threadIdx.x; base < chunks + (int)threadIdx.x; base += kThreads * kBatch) {
    float4 v[kBatch];
    #pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = load_chunk(row, base + u * kThreads, n, vec4);
    RowBatch batch;
    batch.row = row;
    batch.base = base;
    #pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      batch.x[4 * u] = v[u].x;
      batch.x[4 * u + 1] = v[u].y;
      batch.x[4 * u + 2] = v[u].z;
      batch.x[4 * u + 3] = v[u].w;
    }
    batch.valid = 0;
    const bool whole = batch.pos(RowBatch::kSize - 1) < n;  // the usual case: no id past n
    #pragma unroll
    for (int i = 0; i < RowBatch::kSize; ++i) {
      const unsigned key = batch.key(i);
      batch.valid |= (unsigned)((whole || batch.pos(i) < n) && key >= lo && key <= hi) << i;
    }
    f(batch);
  }
}

// Same for the ListBatches of a shared-memory list.
template <class F>
__device__ __forceinline__ void for_list(const uint2* list, int count, F f) {
  for (int base = threadIdx.x; base < count + (int)threadIdx.x; base += kThreads * kListBatch) {
    ListBatch batch;
    batch.list = list;
    batch.base = base;
    batch.valid = 0;
    #pragma unroll
    for (int u = 0; u < kListBatch; ++u) {
      const bool ok = base + u * kThreads < count;
      batch.keys[u] = ok ? list[base + u * kThreads].x : 0u;
      batch.valid |= (unsigned)ok << u;
    }
    f(batch);
  }
}

// Calls write(slot, entry) for the batch's entries picked by bit, at consecutive slots of
// *counter's list: one warp scan and one atomic a warp (all lanes must call it).
template <class B, class W>
__device__ __forceinline__ void append_picked(unsigned picked, const B& batch, int* counter, int limit, W write) {
  const int lane = threadIdx.x & 31;
  const int mine = __popc(picked);
  int incl = mine;
  #pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int other = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += other;
  }
  const int total = __shfl_sync(kFull, incl, 31);
  if (total == 0) return;
  int first = 0;
  if (lane == 31) first = atomicAdd(counter, total);
  int slot = __shfl_sync(kFull, first, 31) + incl - mine;
  for (; picked != 0; picked &= picked - 1, ++slot) {
    if (slot < limit) write(slot, batch.entry(__ffs(picked) - 1));
  }
}

// Folds each warp's (lo, hi) into sh.key_lo / sh.key_hi.
__device__ __forceinline__ void fold_key_range(unsigned lo, unsigned hi, Shared& sh) {
  lo = __reduce_min_sync(kFull, lo);
  hi = __reduce_max_sync(kFull, hi);
  if ((threadIdx.x & 31) == 0 && lo <= hi) {
    atomicMin(&sh.key_lo, lo);
    atomicMax(&sh.key_hi, hi);
  }
}

// Zeroes the histograms (the caller syncs before counting).
__device__ __forceinline__ void clear_histograms(Shared& sh) {
  for (int i = threadIdx.x; i < kCopies * kBins; i += kThreads) (&sh.hist[0][0])[i] = 0;
}

// After counting (and a sync): the bin where the count from the top reaches `target`, via a block
// scan in which each thread owns two adjacent bins. The bin goes to sh.threshold_bin (read it after
// the caller's next sync).
__device__ __forceinline__ void find_threshold_bin(Shared& sh, int target) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int c[2];
  #pragma unroll
  for (int j = 0; j < 2; ++j) {
    int v = 0;
    #pragma unroll
    for (int cp = 0; cp < kCopies; ++cp) v += sh.hist[cp][2 * tid + j];
    c[j] = v;
  }
  int incl = c[0] + c[1];
  #pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) sh.warp_sums[warp] = incl;
  __syncthreads();
  int warps_incl = sh.warp_sums[lane];  // kWarps == 32: a warp scan of the warps' sums
  #pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kFull, warps_incl, off);
    if (lane >= off) warps_incl += v;
  }
  const int warp_base = __shfl_sync(kFull, warps_incl, (warp + 31) & 31) * (warp > 0);
  const int before = warp_base + incl - c[0] - c[1];  // ids in bins above mine
  if (before < target && before + c[0] >= target) sh.threshold_bin = 2 * tid;
  else if (before + c[0] < target && before + c[0] + c[1] >= target) sh.threshold_bin = 2 * tid + 1;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
radix_topk_rows(const float* __restrict__ logits, const int* __restrict__ seq_lens, int* __restrict__ out,
                int max_len, int K) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int b = blockIdx.x;
  const int n = min(seq_lens[b], max_len);
  const int k_eff = min(n, K);
  const float* row = logits + (long long)b * max_len;
  int* row_out = out + (long long)b * K;
  // 16-B loads need 16-B aligned rows; the last chunk then ends within max_len.
  const bool vec4 = (max_len & 3) == 0 && (reinterpret_cast<unsigned long long>(logits) & 15) == 0;
  int* hist = sh.hist[warp % kCopies];

  for (int i = k_eff + tid; i < K; i += kThreads) row_out[i] = -1;
  if (n <= K) {  // everything is selected
    for (int i = tid; i < n; i += kThreads) row_out[i] = i;
    return;
  }
  if (tid == 0) {
    sh.num_greater = 0;
    sh.list_size[0] = 0;
    sh.sampled = 0;
    sh.key_lo = kFull;
    sh.key_hi = 0;
  }
  clear_histograms(sh);
  __syncthreads();

  // The sample: kSamplePerThread chunks a thread, spread over the row, kept in registers.
  const int chunks = (n + 3) >> 2;
  unsigned sample[kSamplePerThread][4];
  int sample_chunk[kSamplePerThread];
  {
    unsigned lo = kFull, hi = 0;
    int sampled = 0;
    #pragma unroll
    for (int j = 0; j < kSamplePerThread; ++j) {
      sample_chunk[j] = (int)((long long)(tid + j * kThreads) * chunks / (kSamplePerThread * kThreads));
      const float4 v = load_chunk(row, sample_chunk[j], n, vec4);
      sample[j][0] = ordered_key(v.x);
      sample[j][1] = ordered_key(v.y);
      sample[j][2] = ordered_key(v.z);
      sample[j][3] = ordered_key(v.w);
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (4 * sample_chunk[j] + e < n) {
          lo = min(lo, sample[j][e]);
          hi = max(hi, sample[j][e]);
          ++sampled;
        }
      }
    }
    fold_key_range(lo, hi, sh);
    sampled = __reduce_add_sync(kFull, sampled);
    if ((tid & 31) == 0) atomicAdd(&sh.sampled, sampled);
  }
  __syncthreads();
  const unsigned sample_lo = sh.key_lo, sample_hi = sh.key_hi;
  const int sample_shift = max(0, 32 - __clz(sample_hi - sample_lo) - kBinBits);

  // Candidates: every key at or above the sample's r-th largest, r about 1.5 times the sample's
  // expected share of the top k (plus 16); usually 1.5-3x k ids, in one pass over the row.
  #pragma unroll
  for (int j = 0; j < kSamplePerThread; ++j) {
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (4 * sample_chunk[j] + e < n) atomicAdd(&hist[bin_of(sample[j][e], sample_hi, sample_shift)], 1);
    }
  }
  __syncthreads();
  const int sampled = sh.sampled;
  find_threshold_bin(sh, min(sampled, (int)((3LL * k_eff * sampled + 2LL * n - 1) / (2LL * n)) + 16));
  if (tid == 0) {  // the candidates' range replaces the sample's
    sh.key_lo = kFull;
    sh.key_hi = 0;
  }
  __syncthreads();
  // tau: the smallest key whose bin is at or above the threshold bin; at least -FLT_MAX, so that
  // -inf (the padding) is never listed and the test is a float compare, one instruction a logit.
  const int sample_bin = sh.threshold_bin;
  const long long lowest = (long long)sample_hi - (((long long)sample_bin + 1) << sample_shift) + 1;
  const unsigned tau = sample_bin == kBins - 1 || lowest < kLowestFiniteKey ? kLowestFiniteKey : (unsigned)lowest;
  {
    const float tau_float = key_float(tau);
    unsigned hi = tau;  // the listed keys' largest; all keys (kFull) if the list overflows
    for_row(row, n, vec4, 0u, kFull, [&](const RowBatch& batch) {
      unsigned picked = 0;
      #pragma unroll
      for (int i = 0; i < RowBatch::kSize; ++i) picked |= (unsigned)(batch.x[i] >= tau_float) << i;
      append_picked(picked & batch.valid, batch, &sh.list_size[0], kListCap, [&](int slot, uint2 entry) {
        sh.list[0][slot] = entry;
        hi = max(hi, entry.x);
      });
    });
    fold_key_range(tau, hi, sh);
  }
  __syncthreads();

  // The source of each round: list 0 or 1, or (src = -1) the row's keys within [filter_lo,
  // filter_hi] when a list overflowed kListCap; its keys' range [key_lo, key_hi] fits the bins.
  int src = 0, count = sh.list_size[0];
  unsigned key_lo = sh.key_lo, key_hi = sh.key_hi, filter_lo = tau, filter_hi = kFull;
  if (count < k_eff) {
    // The sample overestimated the k-th key: select from the whole row, bins over all keys up
    // to the row's largest. key_lo = 0: the range is not exact, so the ties test must not fire.
    src = -1;
    count = n;
    key_lo = 0;
    filter_lo = 0;
  } else if (count > kListCap) {
    src = -1;
    key_hi = kFull;  // the stored entries' largest is not the list's
  }
  auto emit = [&](int slot, uint2 entry) { row_out[slot] = entry.y; };
  int remaining = k_eff;  // ids still to find in the source
  while (true) {
    if (count == remaining || key_lo == key_hi) {
      // Every id of the source is needed, or they all share the k-th key (ties): take the first
      // `remaining` of them.
      if (src >= 0) {
        for (int i = tid; i < remaining; i += kThreads) row_out[sh.num_greater + i] = (int)sh.list[src][i].y;
      } else {
        for_row(row, n, vec4, filter_lo, filter_hi, [&](const RowBatch& batch) {
          append_picked(batch.valid, batch, &sh.num_greater, k_eff, emit);
        });
      }
      return;
    }
    if (src >= 0 && count <= kRankSelectMax) {
      // A short list: rank each entry against the others (ties by list order) and keep the
      // `remaining` best, cheaper than another round.
      const uint2* list = sh.list[src];
      if (tid < count) {
        const unsigned key = list[tid].x;
        int rank = 0;
        for (int j = 0; j < count; ++j) rank += list[j].x > key || (list[j].x == key && j < tid);
        if (rank < remaining) row_out[sh.num_greater + rank] = (int)list[tid].y;
      }
      return;
    }
    const int shift = max(0, 32 - __clz(key_hi - key_lo) - kBinBits);
    clear_histograms(sh);
    __syncthreads();

    auto count_keys = [&](const auto& batch) {
      #pragma unroll
      for (int i = 0; i < batch.kSize; ++i) {
        if ((batch.valid >> i) & 1) atomicAdd(&hist[bin_of(batch.key(i), key_hi, shift)], 1);
      }
    };
    if (src < 0) for_row(row, n, vec4, filter_lo, filter_hi, count_keys);
    else for_list(sh.list[src], count, count_keys);
    __syncthreads();
    find_threshold_bin(sh, remaining);
    const int dst = src == 0 ? 1 : 0;
    if (tid == 0) {
      sh.list_size[dst] = 0;
      sh.key_lo = kFull;
      sh.key_hi = 0;
    }
    __syncthreads();

    // Emit the ids above the threshold bin; list the ones in it, with their keys' exact range.
    const int tbin = sh.threshold_bin;
    unsigned lo = kFull, hi = 0;
    auto emit_or_list = [&](const auto& batch) {
      unsigned greater = 0, listed = 0;
      #pragma unroll
      for (int i = 0; i < batch.kSize; ++i) {
        const int bin = (batch.valid >> i) & 1 ? bin_of(batch.key(i), key_hi, shift) : kBins;
        greater |= (unsigned)(bin < tbin) << i;
        listed |= (unsigned)(bin == tbin) << i;
        if (bin == tbin) {
          lo = min(lo, batch.key(i));
          hi = max(hi, batch.key(i));
        }
      }
      append_picked(greater, batch, &sh.num_greater, k_eff, emit);
      append_picked(listed, batch, &sh.list_size[dst], kListCap,
                    [&](int slot, uint2 entry) { sh.list[dst][slot] = entry; });
    };
    if (src < 0) for_row(row, n, vec4, filter_lo, filter_hi, emit_or_list);
    else for_list(sh.list[src], count, emit_or_list);
    fold_key_range(lo, hi, sh);
    __syncthreads();
    remaining = k_eff - sh.num_greater;
    count = sh.list_size[dst];
    key_lo = sh.key_lo;
    key_hi = sh.key_hi;
    // A list that overflowed stays in the row: its keys are exactly those in [key_lo, key_hi].
    src = count <= kListCap ? dst : -1;
    filter_lo = key_lo;
    filter_hi = key_hi;
    __syncthreads();  // everyone has read the shared state before the next round resets it
  }
}

// Dynamic shared memory the kernel needs, read by the launcher (cuModuleGetGlobal).
extern "C" __device__ const int radix_topk_rows_shared_bytes = sizeof(Shared);
