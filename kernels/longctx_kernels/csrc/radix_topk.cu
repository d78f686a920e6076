// Top-k ids of each row of fp32 logits: one CTA of 1024 threads per row selects, radix-style,
// with 2048 bins fitted to the keys' range in each round.
//
// Same contract as indexer.topk_reference: ids of the k largest logits within seq_len, unordered,
// -1 past min(k, seq_len). Logits are finite or -inf (the indexer's are); a NaN is never listed
// by step 1, which compares floats.
//
// 1. A sample of 8192 logits (2048 float4 chunks spread over the row) gives a threshold key tau
//    (two levels of bins over the sample's keys): about 1.5 times as many keys of the sample lie
//    above it as the top k would hold. One pass over the row lists every id whose key is >= tau,
//    typically 1.5-3x k of them, in shared memory (TOPK_LIST_CAP entries; no global scratch,
//    whatever the row length). If fewer than k are listed, the sample misled, and the rounds
//    below start from the whole row. For long rows at a small batch, radix_topk_candidates does
//    this pass with several CTAs a row (same sample, same tau) into a global list of that size.
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
  int above_threshold;      // ids in the bins above it
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
struct RowBatch {  // kBatch float4 chunks of the row, base + u * kThreads; -inf past n
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

// Calls f(batch) for each RowBatch of chunks [first, last) of the row, valid marking the keys
// in [lo, hi] below n; all threads make the same number of calls.
template <class F>
__device__ __forceinline__ void for_chunks(const float* __restrict__ row, int first, int last, int n, bool vec4,
                                           unsigned lo, unsigned hi, F f) {
  for (int base = first + threadIdx.x; base - (int)threadIdx.x < last; base += kThreads * kBatch) {
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
    const int end = min(n, 4 * last);
    const bool whole = batch.pos(RowBatch::kSize - 1) < end;  // the usual case: no id past the end
    #pragma unroll
    for (int i = 0; i < RowBatch::kSize; ++i) {
      const unsigned key = batch.key(i);
      batch.valid |= (unsigned)((whole || batch.pos(i) < end) && key >= lo && key <= hi) << i;
    }
    f(batch);
  }
}

// The whole row.
template <class F>
__device__ __forceinline__ void for_row(const float* __restrict__ row, int n, bool vec4, unsigned lo, unsigned hi,
                                        F f) {
  for_chunks(row, 0, (n + 3) >> 2, n, vec4, lo, hi, f);
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
  if (before < target && before + c[0] >= target) {
    sh.threshold_bin = 2 * tid;
    sh.above_threshold = before;
  } else if (before + c[0] < target && before + c[0] + c[1] >= target) {
    sh.threshold_bin = 2 * tid + 1;
    sh.above_threshold = before + c[0];
  }
}

// The candidates' threshold key for a row (step 1): the same in every CTA that reads the row.
// Uses the histograms and sh.sampled; leaves sh.key_lo = kFull, sh.key_hi = 0 for the
// candidates' range. All threads call it.
__device__ unsigned sample_threshold(Shared& sh, const float* __restrict__ row, int n, int k_eff, bool vec4) {
  const int tid = threadIdx.x;
  int* hist = sh.hist[(tid >> 5) % kCopies];
  if (tid == 0) {
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

  // The threshold: the sample's r-th largest key, r about 1.5 times the sample's expected share
  // of the top k (plus 16), so that usually 1.5-3x k ids of the row lie at or above it. Two
  // levels: bins over the sample's range, then over the bin holding the r-th key. Keys are
  // log-like, so one level's bins are an eighth of an octave wide for logits around 0: that
  // alone listed 12K candidates of a 1M-token row instead of 5K.
  const int target = min(sh.sampled, (int)((3LL * k_eff * sh.sampled + 2LL * n - 1) / (2LL * n)) + 16);
  unsigned lo = sample_lo, hi = sample_hi;
  int above = 0;
  #pragma unroll 1
  for (int level = 0; level < 2; ++level) {
    const int shift = max(0, 32 - __clz(hi - lo) - kBinBits);
    if (level > 0) {
      clear_histograms(sh);
      __syncthreads();
    }
    #pragma unroll
    for (int j = 0; j < kSamplePerThread; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const unsigned key = sample[j][e];
        if (4 * sample_chunk[j] + e < n && key >= lo && key <= hi) atomicAdd(&hist[bin_of(key, hi, shift)], 1);
      }
    }
    __syncthreads();
    find_threshold_bin(sh, target - above);
    __syncthreads();
    // The threshold bin's keys: [hi - ((t + 1) << shift) + 1, hi - (t << shift)], within [lo, hi].
    const int t = sh.threshold_bin;
    above += sh.above_threshold;
    const long long bin_lo = (long long)hi - (((long long)t + 1) << shift) + 1;
    hi = hi - ((unsigned)t << shift);
    lo = t == kBins - 1 || bin_lo < (long long)lo ? lo : (unsigned)bin_lo;
    __syncthreads();  // everyone has read the threshold before the next level finds another
  }
  if (tid == 0) {  // the candidates' range replaces the sample's
    sh.key_lo = kFull;
    sh.key_hi = 0;
  }
  __syncthreads();
  // tau: the lowest key of the last threshold bin, at least -FLT_MAX, so that -inf (the padding)
  // is never listed and the test is a float compare, one instruction a logit.
  const unsigned tau = max(lo, kLowestFiniteKey);
  return tau;
}

// Lists (key, id) of every id of chunks [first, last) whose key is >= tau at *counter's slots of
// dst (shared or global memory; `cap` entries are stored, all are counted). Returns this thread's
// largest listed key (tau if none). A thread tests 16 logits at once as floats.
__device__ unsigned list_candidates(const float* __restrict__ row, int first, int last, int n, bool vec4,
                                    unsigned tau, int* counter, uint2* dst, int cap) {
  const float tau_float = key_float(tau);
  unsigned hi = tau;
  for_chunks(row, first, last, n, vec4, 0u, kFull, [&](const RowBatch& batch) {
    unsigned picked = 0;
    #pragma unroll
    for (int i = 0; i < RowBatch::kSize; ++i) picked |= (unsigned)(batch.x[i] >= tau_float) << i;
    append_picked(picked & batch.valid, batch, counter, cap, [&](int slot, uint2 entry) {
      dst[slot] = entry;
      hi = max(hi, entry.x);
    });
  });
  return hi;
}

// Step 2 on a source: list `src` (0 or 1) of `count` entries, or (src = -1) the row's keys within
// [filter_lo, filter_hi] when a list overflowed kListCap; [key_lo, key_hi] is the range the bins
// are fitted to. Writes the row's remaining ids after sh.num_greater.
__device__ void select_rounds(Shared& sh, const float* __restrict__ row, int n, bool vec4, int k_eff,
                              int* __restrict__ row_out, int src, int count, unsigned key_lo, unsigned key_hi,
                              unsigned filter_lo, unsigned filter_hi) {
  const int tid = threadIdx.x;
  int* hist = sh.hist[(tid >> 5) % kCopies];
  int remaining = k_eff;  // ids still to find in the source
  while (true) {
    if (count == remaining || key_lo == key_hi) {
      // Every id of the source is needed, or they all share the k-th key (ties): take the first
      // `remaining` of them.
      if (src >= 0) {
        for (int i = tid; i < remaining; i += kThreads) row_out[sh.num_greater + i] = (int)sh.list[src][i].y;
      } else {
        for_row(row, n, vec4, filter_lo, filter_hi, [&](const RowBatch& batch) {
          append_picked(batch.valid, batch, &sh.num_greater, k_eff,
                        [&](int slot, uint2 entry) { row_out[slot] = entry.y; });
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
      append_picked(greater, batch, &sh.num_greater, k_eff, [&](int slot, uint2 entry) { row_out[slot] = entry.y; });
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

}  // namespace

// One CTA a row: steps 1 and 2. With `candidates` (from radix_topk_candidates, `cap` entries a
// row, meta = count, tau, largest key), step 1 is skipped when they fit shared memory.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
radix_topk_rows(const float* __restrict__ logits, const int* __restrict__ seq_lens, int* __restrict__ out,
                int max_len, int K, const uint2* __restrict__ candidates, const int* __restrict__ meta, int cap) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
  const int tid = threadIdx.x;
  const int b = blockIdx.x;
  const int n = min(seq_lens[b], max_len);
  const int k_eff = min(n, K);
  const float* row = logits + (long long)b * max_len;
  int* row_out = out + (long long)b * K;
  // 16-B loads need 16-B aligned rows; the last chunk then ends within max_len.
  const bool vec4 = (max_len & 3) == 0 && (reinterpret_cast<unsigned long long>(logits) & 15) == 0;

  for (int i = k_eff + tid; i < K; i += kThreads) row_out[i] = -1;
  if (n <= K) {  // everything is selected
    for (int i = tid; i < n; i += kThreads) row_out[i] = i;
    return;
  }
  if (tid == 0) {
    sh.num_greater = 0;
    sh.list_size[0] = 0;
  }
  const int listed = candidates ? meta[3 * b] : -1;
  if (listed >= k_eff && listed <= kListCap) {
    for (int i = tid; i < listed; i += kThreads) sh.list[0][i] = candidates[(long long)b * cap + i];
    __syncthreads();
    const unsigned tau = (unsigned)meta[3 * b + 1];
    select_rounds(sh, row, n, vec4, k_eff, row_out, 0, listed, tau, (unsigned)meta[3 * b + 2], tau, kFull);
    return;
  }
  const unsigned tau = sample_threshold(sh, row, n, k_eff, vec4);
  fold_key_range(tau, list_candidates(row, 0, (n + 3) >> 2, n, vec4, tau, &sh.list_size[0], sh.list[0], kListCap),
                 sh);
  __syncthreads();
  int src = 0, count = sh.list_size[0];
  unsigned key_lo = sh.key_lo, key_hi = sh.key_hi, filter_lo = tau;
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
  select_rounds(sh, row, n, vec4, k_eff, row_out, src, count, key_lo, key_hi, filter_lo, kFull);
}

// Step 1 for rows long enough to share: gridDim.x CTAs a row, each listing the candidates of its
// share of the row (against the same sampled threshold) into the row's `cap` global entries;
// meta (zeroed by the caller) gets the count, tau and the largest listed key.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
radix_topk_candidates(const float* __restrict__ logits, const int* __restrict__ seq_lens, int max_len, int K,
                      uint2* __restrict__ candidates, int* __restrict__ meta, int cap) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
  const int b = blockIdx.y;
  const int n = min(seq_lens[b], max_len);
  const int k_eff = min(n, K);
  if (n <= K) return;
  const float* row = logits + (long long)b * max_len;
  const bool vec4 = (max_len & 3) == 0 && (reinterpret_cast<unsigned long long>(logits) & 15) == 0;
  const unsigned tau = sample_threshold(sh, row, n, k_eff, vec4);
  const int chunks = (n + 3) >> 2, share = (chunks + gridDim.x - 1) / gridDim.x;
  const int first = min(chunks, (int)blockIdx.x * share);
  unsigned hi = list_candidates(row, first, min(chunks, first + share), n, vec4, tau, &meta[3 * b],
                                candidates + (long long)b * cap, cap);
  hi = __reduce_max_sync(kFull, hi);
  if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<unsigned*>(&meta[3 * b + 2]), hi);
  if (blockIdx.x == 0 && threadIdx.x == 0) meta[3 * b + 1] = (int)tau;
}

// Dynamic shared memory the kernels need, read by the launcher (cuModuleGetGlobal).
extern "C" __device__ const int radix_topk_rows_shared_bytes = sizeof(Shared);
extern "C" __device__ const int radix_topk_candidates_shared_bytes = sizeof(Shared);
