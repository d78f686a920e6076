// Sparse MLA decode for up to 16 heads, rows streamed raw: consumers on mma.sync, one warp per
// 128-wide latent group (below), or, with SPARSE_MLA_WGMMA (9 to 16 heads, sm_90a), one warpgroup
// a team on wgmma (consume_wgmma).
//
// Same contract as sparse_mla.sparse_mla_decode_reference: q [B, H, 576] bf16, a cache of
// 656-byte fp8_ds_mla rows (512 e4m3 latent, 4 fp32 group scales, 64 bf16 rope), top-k slots
// [B, K] (-1 = none) -> out [B, H, 512] bf16 and lse [B, H] fp32 (base e).
//
// CTA = one (top-k slice, request): SPARSE_MLA_TEAMS teams of 4 consumer warps, which take the
// slice's tiles in turn, and the producers. Consumer w of a team owns latent group w (bytes
// 128w..128w+127 of every row), for both products, so q's fragments for S stay in registers and
// the output accumulators are 128 dims x heads a warp:
//   S partial_w = s_w(t) (q_w . k8_w) + q_rope[16w, 16w+16) . rope[16w, 16w+16), with tokens as
//     the MMA's M and heads as N: each thread's 4 bytes of a row per k-step are its A fragment's
//     halves, for a permuted order of the k-step's 16 dims that q's B fragments follow too;
//   the four partials meet in shared memory (one barrier a tile), stored [head][token]; every
//     warp sums them in the same order, in the layout of P's B fragment below (head g, tokens
//     2t, 2t+1), so all four run the same online softmax on identical values;
//   O^T_w += V8_w^T (P s_w / s_ref)^T, latent dims as M: one byte permute per token pair turns
//     two raw rows into the A fragment (each m-tile takes the dim pair 16g + 2j, +1).
// e4m3 -> fp16 is exact (one cvt per pair); q and P are fp16 too, the rope bf16.
// SPARSE_MLA_PRODUCERS more warps, the producers, stream the rows by 16-B cp.async copies into a
// ring of SPARSE_MLA_STAGES tiles: a stage is "full" (mbarrier) once its rows and slots have
// landed, and refilled as soon as its team's four consumer warps have arrived on its "empty" mbarrier.
// A request's SPARSE_MLA_SPLITS slices are one thread-block cluster: at the end every team sends
// its unnormalized output, max and sum through distributed shared memory to the CTA that merges
// its latent group, and that CTA writes the final rows (on wgmma, a CTA's first team hands its
// part to the last, which folds it in and sends one part a CTA). No partials in global memory, no
// second kernel (the separate merge cost ~3 us at B=64, H=8; docs/benchmarks.md).

// No headers: NVRTC compiles it at run time (longctx_kernels.cuda_module).

namespace {

// Defaults: the launcher's for up to 8 heads (sparse_mla.sparse_mla_decode_cuda passes them all).
#ifndef SPARSE_MLA_TILE
#define SPARSE_MLA_TILE 64
#endif
#ifndef SPARSE_MLA_STAGES
#define SPARSE_MLA_STAGES 3
#endif
#ifndef SPARSE_MLA_HEAD_TILES
#define SPARSE_MLA_HEAD_TILES 1
#endif
#ifndef SPARSE_MLA_CTAS_PER_SM
#define SPARSE_MLA_CTAS_PER_SM 1
#endif
#ifndef SPARSE_MLA_PRODUCERS
#define SPARSE_MLA_PRODUCERS 2
#endif
#ifndef SPARSE_MLA_SPLITS
#define SPARSE_MLA_SPLITS 2
#endif
#ifndef SPARSE_MLA_TEAMS
#define SPARSE_MLA_TEAMS 2
#endif
#ifndef SPARSE_MLA_WGMMA
#define SPARSE_MLA_WGMMA 0
#endif
constexpr int kWarps = 4;                  // consumers of a team, one per latent group
constexpr int kTeams = SPARSE_MLA_TEAMS;   // teams of consumers, taking the ring's tiles in turn
constexpr int kConsumers = kWarps * kTeams;
constexpr int kProducers = SPARSE_MLA_PRODUCERS;  // warps copying the rows
constexpr int kThreads = 32 * (kConsumers + kProducers);
constexpr int kTile = SPARSE_MLA_TILE;     // rows a stage: 32 or 64
constexpr int kStages = SPARSE_MLA_STAGES;
constexpr int kHeadTiles = SPARSE_MLA_HEAD_TILES;  // n8 head tiles of P.V: 1 (H <= 8) or 2 (H <= 16)
constexpr int kHeads = 8 * kHeadTiles;
constexpr int kTokenTiles = kTile / 8;     // n8 token tiles of S
constexpr int kChunks = kTile / 16;        // k16 token chunks of P.V
constexpr int kRowBytes = 656;             // 41 x 16 B: rows are 16-B aligned, one bank unit apart
constexpr int kScaleOffset = 512, kRopeOffset = 528;
constexpr int kPartialStride = kTile + 8;  // floats a head: the float2 reads hit distinct banks
#define kInf __int_as_float(0x7f800000)
constexpr int kSplits = SPARSE_MLA_SPLITS;  // CTAs of a request = the cluster; CTA c merges latent groups c, c + kSplits, ...
static_assert(4 % kSplits == 0, "each CTA of the cluster merges whole latent groups");
constexpr int kGroupsMerged = 4 / kSplits;
constexpr int kParts = kSplits * kTeams;  // partial outputs a request's merge combines

static_assert(kTile % 16 == 0 && kTile <= 64, "tiles of 16-token chunks, at most 64 rows");
#if SPARSE_MLA_WGMMA
static_assert(kTile == 64 && kHeads == 16, "the wgmma consumers take 64-token tiles (S's M) and 16 heads (N)");
// Registers a thread after setmaxnreg: the producers (a warpgroup of their own) give theirs to the
// consumers' accumulators and fragments. The sum stays within what the launch took (65536 at most,
// in the __launch_bounds__ cap: ptxas rounds each thread's count down to a multiple of 8).
// setmaxnreg works on whole warpgroups: with four producer warps.
constexpr bool kSplitRegisters = kProducers == 4 && kConsumers % 4 == 0;
constexpr int kLaunchRegs = (65536 / kThreads) & ~7;
constexpr int kProducerRegs = 56;
constexpr int kConsumerShare = ((kLaunchRegs * kThreads - kProducerRegs * 32 * kProducers) / (32 * kConsumers)) & ~7;
constexpr int kConsumerRegs = kConsumerShare < 256 ? kConsumerShare : 256;  // setmaxnreg's most
#endif

#if !SPARSE_MLA_WGMMA
// The merge's inputs: for each latent group the CTA merges, every team's unnormalized output
// (relative to exp2(m)), m and l. A region of its own, not the ring's: a team then sends its part
// as soon as it is done, without waiting for the merging CTA to finish its tiles (0.2-0.3 us).
struct MergeIn {
  float o[kGroupsMerged][kParts][kHeads][128];
  float m[kGroupsMerged][kParts][kHeads];
  float l[kGroupsMerged][kParts][kHeads];
};
#endif

#if SPARSE_MLA_WGMMA
// What the wgmma consumers share (consume_wgmma): wgmma's B operands (q K-major in 128-byte-swizzled
// rows, swizzled(); P MN-major in 32-byte-swizzled rows, p_offset()), and the team's exchange of tile
// maxima and, at the end, sums.
struct WgmmaShared {
  unsigned char q[9 * kHeads * 128];       // q as S's B: 9 blocks of 64 dims (8 latent fp16, 1 rope bf16) x heads
  // P s_g / s_ref as P.V's B, one a latent group: 64 token rows of 32 B (MN-major, the 16 heads fp16),
  // so a thread stores its two heads of a token in one word (rows of 128 B would be three quarters
  // padding).
  unsigned char p[kTeams][4][kTile * 32];
  float tile_max[kTeams][kWarps][kHeads];  // each warp's maximum of a tile's scores, per head
  float tile_ref[kTeams][kWarps];          // and of its tokens' group scales
  float l[kTeams][kWarps][kHeads];         // each warp's sum of exponentials, at the end
  float weight[kSplits][kHeads];           // the merge's: each part's weight for each head
};

// The merge of the wgmma consumers, every value in the order of the threads that hold it (a warp's
// stores and loads are contiguous). The first team leaves its output (relative to exp2(m)), m and
// l for the last, in the ring's stage of its own last tile (no other tile comes there); the last
// team folds them into its registers and sends each latent group to the CTA that merges it, into
// a region of its own, not the ring's: a CTA sends as soon as it is done, without waiting for the
// others' tiles.
struct TeamPart {
  float4 o[4][4][128];  // group p, the thread's dims 4 x heads hi, thread of the team
  float m[kHeads], l[kHeads];
};
struct SlicePart {
  float4 o[kGroupsMerged][4][128];  // merged group gl, heads hi, thread of the team
  float m[kHeads], l[kHeads];
};
#endif

struct Shared {
#if SPARSE_MLA_WGMMA
  alignas(1024) WgmmaShared wg;       // first: the 128-byte swizzle repeats every 1024 B
#endif
  unsigned char rows[kStages][kTile * kRowBytes];
#if SPARSE_MLA_WGMMA
  SlicePart parts[kSplits];           // of the latent groups this CTA merges, by the CTA that sends them
#else
  float partial[kTeams][2][kWarps][kHeads * kPartialStride];  // a team's S partials of its tiles i and i + 1
  MergeIn merge;                      // filled by the cluster's teams
#endif
  int slots[kStages][kTile];          // the stage's top-k slots (-1 = none)
  unsigned long long full[kStages];   // mbarriers: the stage's rows and slots have landed
  unsigned long long empty[kStages];  // mbarriers: the consumer warps are done with the stage
};

#include "barriers.cuh"
#include "numeric.cuh"

// d (+)= a * b, m16n8k16, fp32 accumulators; fp16 or bf16 operands.
__device__ __forceinline__ void mma_f16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                        unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 32 bytes of shared memory (16-B aligned) as 8 words, by two 16-B loads.
__device__ __forceinline__ void load32(const unsigned char* p, unsigned (&w)[8]) {
  const uint4 lo = *reinterpret_cast<const uint4*>(p), hi = *reinterpret_cast<const uint4*>(p + 16);
  w[0] = lo.x; w[1] = lo.y; w[2] = lo.z; w[3] = lo.w; w[4] = hi.x; w[5] = hi.y; w[6] = hi.z; w[7] = hi.w;
}

__device__ __forceinline__ void cluster_store4(unsigned addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// 16 bytes global -> shared, of which the first `bytes` (16 or 0) are read and the rest zero-filled.
__device__ __forceinline__ void copy16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

#if SPARSE_MLA_WGMMA
constexpr int kFullArrivals = 2 * kProducers;  // per producer warp: its rows' bytes expected, its slots stored
// Producer warp `producer` (the wgmma consumers' variant): tile after tile into the ring, each as
// soon as the consumers have freed its stage. Lane l < 16 takes row producer + kProducers l of
// every tile, its slot read one tile ahead: one bulk copy of the 656-B row by the copy engine onto
// the stage's full barrier (an LSU copy a 16-B chunk took issue slots and MIO queue from the
// consumers), or, for a missing row (slot -1), zeros stored by the warp, never a read of a shared
// row.
__device__ __forceinline__ void produce(Shared& sh, const unsigned char* __restrict__ cache,
                                        const int* __restrict__ slots, int count, int n_tiles, int lane, int producer) {
  constexpr int kRowsPerWarp = kTile / kProducers;
  static_assert(kRowsPerWarp <= 32, "a lane a row");
  const bool copier = lane < kRowsPerWarp;
  const int row = producer + kProducers * lane;
  int next = copier && row < count ? __ldg(slots + row) : -1;
  for (int j = 0; j < n_tiles; ++j) {
    const int cur = next;
    next = copier && (j + 1) * kTile + row < count ? __ldg(slots + (j + 1) * kTile + row) : -1;
    const int stage = j % kStages;
    if (j >= kStages) mbar_wait(&sh.empty[stage], (j / kStages + 1) & 1);
    const unsigned real = __ballot_sync(0xffffffffu, copier && cur >= 0);
    const unsigned full = smem_addr(&sh.full[stage]);
    if (lane == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full), "r"(__popc(real) * kRowBytes) : "memory");
    if (copier && cur >= 0)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                   ::"r"(smem_addr(sh.rows[stage] + row * kRowBytes)),
                   "l"(cache + static_cast<unsigned long long>(cur) * kRowBytes), "n"(kRowBytes), "r"(full) : "memory");
    // Missing rows, zeroed by the whole warp: 16 B a lane, 41 chunks a row.
    for (unsigned missing = __ballot_sync(0xffffffffu, copier && cur < 0); missing; missing &= missing - 1) {
      unsigned char* zeros = sh.rows[stage] + (producer + kProducers * (__ffs(missing) - 1)) * kRowBytes;
      *reinterpret_cast<uint4*>(zeros + 16 * lane) = make_uint4(0u, 0u, 0u, 0u);
      if (lane < kRowBytes / 16 - 32) *reinterpret_cast<uint4*>(zeros + 512 + 16 * lane) = make_uint4(0u, 0u, 0u, 0u);
    }
    if (copier) sh.slots[stage][row] = cur;
    __syncwarp();  // the warp's zeros and slots, then one arrival for them
    if (lane == 0) mbar_arrive(&sh.full[stage]);
  }
}
#else
constexpr int kFullArrivals = 64 * kProducers;
// Producer warp `producer`: tile after tile into the ring, each as soon as the consumers have
// freed its stage, copying rows producer, producer + kProducers, ... Lane l holds the slots of rows
// l (and l + 32) of a tile, read one tile ahead, and their offsets in 16-B units; a row is 41 16-B
// cp.async copies, lane l taking chunks l and l + 32, at one broadcast and one multiply-add a row
// (the rows' loop is unrolled, so the shared addresses are immediates); a missing row (slot -1,
// which masks it) is zeros, read from nowhere. The stage's full barrier takes 32 arrivals a producer when the lanes'
// copies land and 32 when their slots (the same in every producer) are stored.
__device__ __forceinline__ void produce(Shared& sh, const unsigned char* __restrict__ cache,
                                        const int* __restrict__ slots, int count, int n_tiles, int lane, int producer) {
  constexpr int kSlotsPerLane = kTile / 32;
  static_assert(32 % kProducers == 0, "a producer's k-th row is among the tile's first 32 iff k < 32 / kProducers");
  const unsigned char* lane_src = cache + 16 * lane;
  int next[kSlotsPerLane];
  #pragma unroll
  for (int u = 0; u < kSlotsPerLane; ++u) next[u] = 32 * u + lane < count ? __ldg(slots + 32 * u + lane) : -1;
  for (int j = 0; j < n_tiles; ++j) {
    int cur[kSlotsPerLane];
    #pragma unroll
    for (int u = 0; u < kSlotsPerLane; ++u) {
      cur[u] = next[u];
      const int k = (j + 1) * kTile + 32 * u + lane;
      next[u] = k < count ? __ldg(slots + k) : -1;
    }
    unsigned units[kSlotsPerLane];  // the lane's rows' offsets in the cache, in 16-B units; ~0u: no row
    #pragma unroll
    for (int u = 0; u < kSlotsPerLane; ++u) units[u] = cur[u] >= 0 ? static_cast<unsigned>(cur[u]) * (kRowBytes / 16) : ~0u;
    const int stage = j % kStages;
    if (j >= kStages) mbar_wait(&sh.empty[stage], (j / kStages + 1) & 1);
    const unsigned dst = smem_addr(sh.rows[stage] + producer * kRowBytes) + 16 * lane;
    #pragma unroll
    for (int k = 0; k < kTile / kProducers; ++k) {  // row producer + kProducers k
      const unsigned unit = __shfl_sync(0xffffffffu, units[k / (32 / kProducers)], (producer + kProducers * k) % 32);
      // A missing row is zeros: the copy reads nothing (source size 0). Copies of one shared row
      // (row 0) from every SM made a hot spot in L2 (B=64, H=8, half the slots -1: 260 us).
      const bool real = unit != ~0u;
      const unsigned char* src = lane_src + static_cast<unsigned long long>(real ? unit : 0u) * 16;
      const unsigned bytes = real ? 16u : 0u;
      copy16(dst + kProducers * k * kRowBytes, src, bytes);
      if (lane < kRowBytes / 16 - 32) copy16(dst + kProducers * k * kRowBytes + 512, src + 512, bytes);
    }
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(&sh.full[stage])) : "memory");
    #pragma unroll
    for (int u = 0; u < kSlotsPerLane; ++u) sh.slots[stage][32 * u + lane] = cur[u];
    mbar_arrive(&sh.full[stage]);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
#endif

// Tile i's rows in the ring, once they have landed. With several teams, the stage's previous tile
// (i - kStages) may be another team's and still landing: the full barrier's parity names tile i
// only once that tile is consumed.
__device__ __forceinline__ const unsigned char* landed(Shared& sh, int i) {
  const int stage = i % kStages;
  if (kTeams > 1 && i >= kStages) mbar_wait(&sh.empty[stage], ((i - kStages) / kStages) & 1);
  mbar_wait(&sh.full[stage], (i / kStages) & 1);
  return sh.rows[stage];
}

#if !SPARSE_MLA_WGMMA
// The merge, in CTA `rank` of the cluster: its latent groups of every part (MergeIn) -> out
// [B, H, 512] bf16 and, in rank 0, lse [B, H] (base e). 8 dims of a head a thread and step.
__device__ __forceinline__ void merge_parts(const Shared& sh, unsigned short* __restrict__ out,
                                             float* __restrict__ out_lse, int b, int H, int rank, int tid) {
  const MergeIn& in = sh.merge;
  constexpr int kItems = kGroupsMerged * kHeads * 16;
  for (int item = tid; item < kItems; item += kThreads) {
    const int gl = item / (kHeads * 16), h = item / 16 % kHeads, d = 8 * (item % 16);
    if (h >= H) continue;
    float m_max = -kInf, weight[kParts], l = 0.f;
    #pragma unroll
    for (int c = 0; c < kParts; ++c) m_max = fmaxf(m_max, in.m[gl][c][h]);
    #pragma unroll
    for (int c = 0; c < kParts; ++c) {
      weight[c] = exp2_approx(in.m[gl][c][h] - m_max);  // a part with no valid token: m = -1e30, l = 0
      l += weight[c] * in.l[gl][c][h];
    }
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    float acc[8] = {};
    #pragma unroll
    for (int c = 0; c < kParts; ++c) {
      const float f = weight[c] * inv_l;
      const float4 lo = *reinterpret_cast<const float4*>(&in.o[gl][c][h][d]);
      const float4 hi = *reinterpret_cast<const float4*>(&in.o[gl][c][h][d + 4]);
      acc[0] += f * lo.x; acc[1] += f * lo.y; acc[2] += f * lo.z; acc[3] += f * lo.w;
      acc[4] += f * hi.x; acc[5] += f * hi.y; acc[6] += f * hi.z; acc[7] += f * hi.w;
    }
    *reinterpret_cast<uint4*>(out + ((long long)b * H + h) * 512 + 128 * (rank + kSplits * gl) + d) =
        make_uint4(pack_bf16x2(acc[0], acc[1]), pack_bf16x2(acc[2], acc[3]), pack_bf16x2(acc[4], acc[5]),
                   pack_bf16x2(acc[6], acc[7]));
    if (rank == 0 && gl == 0 && d == 0) out_lse[(long long)b * H + h] = l > 0.f ? (m_max + log2f(l)) * 0.6931471805599453f : -kInf;
  }
}
#endif

#if SPARSE_MLA_WGMMA
// 9 to 16 heads on wgmma (sm_90a). A team is one warpgroup; warp j of it owns tokens 16j .. 16j + 15
// of each 64-token tile for S and output dims 128p + 32j .. + 31 of every latent group p for P.V.
//   S [64 tokens x 16 heads] = k q^T by wgmma m64n16k16, tokens as M: the rows' fp8 bytes are the
//     register A operand (thread (g, t) holds tokens 16j + g and + 8 and, per latent group, dims
//     32t .. 32t + 31: k-step s takes its bytes 4s .. 4s + 3, whose cvt halves are the fragment's
//     k pairs 2t and 2t + 8, an order q's shared copy follows), one fp32 accumulator a group,
//     scaled per token in fp32, and the rope in bf16. Every row is whole in one warp: no partial
//     sums cross warps, and each score is computed and exponentiated once.
//   The tile maximum per head meets across the four warps in shared memory (one barrier); each
//     thread writes its P values, times s_g / s_ref, as four fp16 tiles (tokens x heads), one a
//     group, the B operands of P.V (a second barrier).
//   O^T [dims x 16 heads] += V8^T (P s_g / s_ref)^T by wgmma m64n16k16, dims as M: rows 16j + g and
//     + 8 of the two 64-row slabs h of group p are dims 128p + 32j + 4g + 2h and + 1, so a thread's
//     A fragment for 16 tokens is one byte permute and two cvts per pair of token rows.
// Heads take the accumulators' columns in both products, so a thread's output columns are the
// heads of its scores: rescaling needs no shuffle.

#include "wgmma.cuh"

// wgmma descriptor of a K-major, 128-byte-swizzled operand at `addr`: 8-row groups 1024 B apart.
__device__ __forceinline__ unsigned long long operand(unsigned addr) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// Byte offset of 16-B chunk `chunk` (heads 8 chunk .. + 7) of token row `row` in a P tile: 32-B rows,
// the chunk index XOR the row's bit 2 (the 32-byte swizzle: address bit 4 ^= bit 7).
__device__ __forceinline__ int p_offset(int row, int chunk) { return row * 32 + ((chunk ^ ((row >> 2) & 1)) << 4); }

// wgmma descriptor of an MN-major, 32-byte-swizzled operand of 16 16-bit columns at `addr`: 8-row
// groups of K 256 B apart.
__device__ __forceinline__ unsigned long long operand_mn32(unsigned addr) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (16ull << 32) | (3ull << 62);
}

// D[64 x 16] (+)= A[64 x 16] B[16 x 16]: A in registers, B in shared memory, K-major (or, fp16 only,
// MN-major: operand_mn32); fp16 or bf16.
template <bool kBf16, bool kMnMajorB = false>
__device__ __forceinline__ void wgmma_n16(float (&d)[8], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned long long b, int accumulate) {
  if (kMnMajorB)
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
  else if (kBf16)
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void store_shared_u32(unsigned addr, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// q [b, :H] into WgmmaShared::q: dim d of group p (d - 128p = 32t + 4s + e) at k-step 8p + s, k
// index 2t + e (e < 2) or 8 + 2t + e - 2; rope dim 512 + 16t + 4s + e likewise at step 32 + s. fp16
// latent, bf16 rope; heads past H are zeros. By all `kConsumers` warps, 16 B (8 dims) a load, every
// load in flight before the first store (one load at a time took ~10 us).
__device__ __forceinline__ void stage_q(Shared& sh, const unsigned short* __restrict__ q, int b, int H, int tid) {
  constexpr int kLoads = kHeads * 72, kPerThread = (kLoads + 32 * kConsumers - 1) / (32 * kConsumers);
  uint4 v[kPerThread];
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int i = tid + 32 * kConsumers * n, h = i / 72;
    v[n] = i < kLoads && h < H ? *reinterpret_cast<const uint4*>(q + ((long long)b * H + h) * 576 + 8 * (i % 72))
                               : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int i = tid + 32 * kConsumers * n, h = i / 72;
    if (i >= kLoads) break;
    const unsigned words[4] = {v[n].x, v[n].y, v[n].z, v[n].w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // dims d, d + 1
      const int d = 8 * (i % 72) + 2 * u;
      const bool rope = d >= 512;
      const int local = rope ? d - 512 : d & 127;
      const int t = rope ? local >> 4 : local >> 5, s = rope ? (local >> 2) & 3 : (local >> 2) & 7, e = local & 3;
      const int step = rope ? 32 + s : 8 * (d >> 7) + s, kk = e < 2 ? 2 * t + e : 8 + 2 * t + e - 2;
      *reinterpret_cast<unsigned*>(sh.wg.q + swizzled(kHeads, h, 2 * step + (kk >> 3)) + 2 * (kk & 7)) =
          rope ? words[u] : bf16x2_to_f16x2(words[u]);
    }
  }
  fence_async_shared();  // read next by wgmma
}

constexpr float kMaxSlack = 4.f;  // log2 units

// P.V's A operand of latent group p comes from rows 16c + 2t, +1, +8, +9 (token chunk c): this
// thread's 4 bytes at dims 128p + 32j + 4g of each.
__device__ __forceinline__ void pv_bytes(const unsigned char* rows, int p, int j, int lane, unsigned (&w)[4][4]) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const unsigned char* base = rows + (16 * c + 2 * t) * kRowBytes + 128 * p + 32 * j + 4 * g;
    w[c][0] = *reinterpret_cast<const unsigned*>(base);
    w[c][1] = *reinterpret_cast<const unsigned*>(base + kRowBytes);
    w[c][2] = *reinterpret_cast<const unsigned*>(base + 8 * kRowBytes);
    w[c][3] = *reinterpret_cast<const unsigned*>(base + 9 * kRowBytes);
  }
}

__device__ __forceinline__ void team_sync(int team) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + team), "n"(32 * kWarps) : "memory");
}

// The team's tiles team, team + kTeams, ... of the ring, then the merge (TeamPart, SlicePart): the
// first team's part (o s_ref, m, l) to the last, the last's (both folded) to the CTAs that merge
// each latent group, and this CTA's groups of every part to out and lse. Accumulator register r
// of a thread: row (token or dim) +8 if r & 2, head 8 (r >> 2) + 2t + (r & 1); its four heads are
// numbered hi = 2 (r >> 2) + (r & 1).
// A wgmma descriptor is computed once and offset by a constant at each use.
__device__ __forceinline__ void consume_wgmma(Shared& sh, unsigned short* __restrict__ out, float* __restrict__ out_lse,
                                              int b, int H, int n_tiles, int team, int j, int lane, int split,
                                              float qk_scale_log2) {
  const int g = lane >> 2, t = lane & 3;
  const unsigned long long q_desc = operand(smem_addr(sh.wg.q)), p_desc = operand_mn32(smem_addr(sh.wg.p[team][0]));
  float o[4][2][8];  // group p, slab h
#pragma unroll
  for (int p = 0; p < 4; ++p)
#pragma unroll
    for (int r = 0; r < 8; ++r) o[p][0][r] = o[p][1][r] = 0.f;
  float m_run[4] = {-1e30f, -1e30f, -1e30f, -1e30f}, l_run[4] = {0.f, 0.f, 0.f, 0.f};
  float s_ref = 0.f, inv_ref = 0.f;  // o holds output / s_ref

  for (int i = team; i < n_tiles; i += kTeams) {
    const int stage = i % kStages;
    const unsigned char* rows = landed(sh, i);
    const unsigned char* row0 = rows + (16 * j + g) * kRowBytes;  // this thread's tokens for S
    const unsigned char* row1 = row0 + 8 * kRowBytes;

    // S, a latent group at a time: the next group's conversion runs while this one's MMAs do.
    float sacc[4][8], racc[8];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      if (p >= 2) wgmma_wait<1>();  // group p - 2's fragments are free
      unsigned w0[8], w1[8];
      load32(row0 + 128 * p + 32 * t, w0);
      load32(row1 + 128 * p + 32 * t, w1);
      unsigned a[8][4];
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        a[s][0] = e4m3x2_lo(w0[s]); a[s][1] = e4m3x2_lo(w1[s]);
        a[s][2] = e4m3x2_hi(w0[s]); a[s][3] = e4m3x2_hi(w1[s]);
      }
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int step = 8 * p + s;
        wgmma_n16<false>(sacc[p], a[s][0], a[s][1], a[s][2], a[s][3],
                         q_desc + (((step >> 2) * kHeads * 128 + (step & 3) * 32) >> 4), s > 0);
      }
      wgmma_commit();
    }
    {
      wgmma_wait<1>();
      unsigned w0[8], w1[8];
      load32(row0 + kRopeOffset + 32 * t, w0);
      load32(row1 + kRopeOffset + 32 * t, w1);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s)
        wgmma_n16<true>(racc, w0[2 * s], w1[2 * s], w0[2 * s + 1], w1[2 * s + 1],
                        q_desc + ((8 * kHeads * 128 + s * 32) >> 4), s > 0);
      wgmma_commit();
    }
    unsigned pv[4][4];  // P.V's bytes of the next latent group
    pv_bytes(rows, 0, j, lane, pv);
    const float4 sc0 = *reinterpret_cast<const float4*>(row0 + kScaleOffset);
    const float4 sc1 = *reinterpret_cast<const float4*>(row1 + kScaleOffset);
    const bool ok0 = sh.slots[stage][16 * j + g] >= 0, ok1 = sh.slots[stage][16 * j + g + 8] >= 0;
    wgmma_wait<0>();
#pragma unroll
    for (int p = 0; p < 4; ++p) pin(sacc[p]);
    pin(racc);

    // Scores in log2 units, masked; this warp's maxima over its 16 tokens, then the tile's.
    float s[8], mx[4];
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const float4 sc = (r & 2) ? sc1 : sc0;
      const float v = sc.x * sacc[0][r] + sc.y * sacc[1][r] + sc.z * sacc[2][r] + sc.w * sacc[3][r] + racc[r];
      s[r] = ((r & 2) ? ok1 : ok0) ? v * qk_scale_log2 : -kInf;
    }
#pragma unroll
    for (int hi = 0; hi < 4; ++hi) {
      const int r = 4 * (hi >> 1) + (hi & 1);
      mx[hi] = fmaxf(s[r], s[r + 2]);
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 4));
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 8));
      mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 16));
    }
    float ref = fmaxf(fmaxf(fmaxf(sc0.x, sc0.y), fmaxf(sc0.z, sc0.w)), fmaxf(fmaxf(sc1.x, sc1.y), fmaxf(sc1.z, sc1.w)));
    ref = fmaxf(ref, __shfl_xor_sync(0xffffffffu, ref, 4));  // a missing row's scales are zeros
    ref = fmaxf(ref, __shfl_xor_sync(0xffffffffu, ref, 8));
    ref = fmaxf(ref, __shfl_xor_sync(0xffffffffu, ref, 16));
    if (g == 0) {
      *reinterpret_cast<float2*>(&sh.wg.tile_max[team][j][2 * t]) = make_float2(mx[0], mx[1]);
      *reinterpret_cast<float2*>(&sh.wg.tile_max[team][j][8 + 2 * t]) = make_float2(mx[2], mx[3]);
      if (t == 0) sh.wg.tile_ref[team][j] = ref;
    }
    team_sync(team);
    float alpha[4], tile_ref = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float2 lo = *reinterpret_cast<const float2*>(&sh.wg.tile_max[team][w][2 * t]);
      const float2 hi = *reinterpret_cast<const float2*>(&sh.wg.tile_max[team][w][8 + 2 * t]);
      mx[0] = fmaxf(mx[0], lo.x); mx[1] = fmaxf(mx[1], lo.y); mx[2] = fmaxf(mx[2], hi.x); mx[3] = fmaxf(mx[3], hi.y);
      tile_ref = fmaxf(tile_ref, sh.wg.tile_ref[team][w]);
    }
    // The running max moves only when a tile's exceeds it by 2^kMaxSlack, so o is rarely rescaled;
    // P then stays below 2^kMaxSlack (times s_g / s_ref < 2^8: within fp16's range).
    bool grew = false;
#pragma unroll
    for (int hi = 0; hi < 4; ++hi) {
      const bool moves = mx[hi] > m_run[hi] + kMaxSlack;  // the same in the whole team
      alpha[hi] = moves ? exp2_approx(m_run[hi] - mx[hi]) : 1.f;
      grew |= moves;
      m_run[hi] = moves ? mx[hi] : m_run[hi];
    }
    // o's unit s_ref: the first tile's largest group scale, raised only when a tile's outgrow it by
    // 2^8, so P s_g / s_ref stays well inside fp16's range and o is rarely rescaled for it.
    float unit_ratio = 1.f;  // old unit / new unit; the same in the whole team
    if (tile_ref > 256.f * s_ref) {
      unit_ratio = s_ref / tile_ref;
      s_ref = tile_ref;
      inv_ref = 1.f / tile_ref;
    }
    float pr[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) pr[r] = exp2_approx(s[r] - m_run[2 * (r >> 2) + (r & 1)]);
#pragma unroll
    for (int hi = 0; hi < 4; ++hi) {
      const int r = 4 * (hi >> 1) + (hi & 1);
      l_run[hi] = l_run[hi] * alpha[hi] + pr[r] + pr[r + 2];
    }
    // P s_g / s_ref into group p's tile, token rows: heads 8hb + 2t, +1 of token 16j + g (+8) are
    // one word of 16-B chunk hb (the warp's 32 words in distinct banks).
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const unsigned tile = smem_addr(sh.wg.p[team][p]);
      const float f0 = (p == 0 ? sc0.x : p == 1 ? sc0.y : p == 2 ? sc0.z : sc0.w) * inv_ref;
      const float f1 = (p == 0 ? sc1.x : p == 1 ? sc1.y : p == 2 ? sc1.z : sc1.w) * inv_ref;
#pragma unroll
      for (int r = 0; r < 8; r += 2) {
        const int hb = r >> 2, row = (r & 2) ? 1 : 0;
        const float f = row ? f1 : f0;
        store_shared_u32(tile + p_offset(16 * j + g + 8 * row, hb) + 4 * t, pack_f16x2(pr[r] * f, pr[r + 1] * f));
      }
    }
    fence_async_shared();  // read next by wgmma
    if (grew || unit_ratio != 1.f) {
#pragma unroll
      for (int p = 0; p < 4; ++p)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int r = 0; r < 8; ++r) o[p][h][r] *= alpha[2 * (r >> 2) + (r & 1)] * unit_ratio;
    }
    team_sync(team);  // every P tile is written

    // P.V, a latent group at a time; each group's bytes are loaded while the previous group's
    // MMAs run (the first group's before the softmax).
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      if (p >= 2) wgmma_wait<1>();
      unsigned a[4][2][4];  // token chunk c, slab h
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const unsigned x = pv[c][0], y = pv[c][1], z = pv[c][2], u = pv[c][3];
        if (c == 3 && p < 3) pv_bytes(rows, p + 1, j, lane, pv);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Bytes 2h, 2h + 1 of each: (token 2t, token 2t + 1) pairs of dims 4g + 2h and + 1.
          const unsigned sel = h ? 0x7362u : 0x5140u;
          const unsigned xy = byte_perm(x, y, sel), zu = byte_perm(z, u, sel);
          a[c][h][0] = e4m3x2_lo(xy); a[c][h][1] = e4m3x2_hi(xy);
          a[c][h][2] = e4m3x2_lo(zu); a[c][h][3] = e4m3x2_hi(zu);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) wgmma_n16<false, true>(o[p][h], a[c][h][0], a[c][h][1], a[c][h][2], a[c][h][3],
                                                           p_desc + ((p * kTile * 32 + 512 * c) >> 4), 1);
      wgmma_commit();
    }
    __syncwarp();  // every lane's reads of the stage are done
    if (lane == 0) mbar_arrive(&sh.empty[stage]);
    // o and the P tiles are free again only when P.V is done. (P.V left in flight into the next
    // tile's S made ptxas serialize every wgmma: C7514.)
    wgmma_wait<0>();
#pragma unroll
    for (int p = 0; p < 4; ++p) { pin(o[p][0]); pin(o[p][1]); }
  }

  // The team's sums: over the warp's lanes of a head, then over its warps.
#pragma unroll
  for (int hi = 0; hi < 4; ++hi) {
    l_run[hi] += __shfl_xor_sync(0xffffffffu, l_run[hi], 4);
    l_run[hi] += __shfl_xor_sync(0xffffffffu, l_run[hi], 8);
    l_run[hi] += __shfl_xor_sync(0xffffffffu, l_run[hi], 16);
  }
  if (g == 0) {
    *reinterpret_cast<float2*>(&sh.wg.l[team][j][2 * t]) = make_float2(l_run[0], l_run[1]);
    *reinterpret_cast<float2*>(&sh.wg.l[team][j][8 + 2 * t]) = make_float2(l_run[2], l_run[3]);
  }
  team_sync(team);
  const auto head = [&](int hi) { return 8 * (hi >> 1) + 2 * t + (hi & 1); };  // the thread's head hi
  float l[4];  // the team's sum of each of the thread's heads
#pragma unroll
  for (int hi = 0; hi < 4; ++hi) {
    const int h = head(hi);
    l[hi] = sh.wg.l[team][0][h] + sh.wg.l[team][1][h] + sh.wg.l[team][2][h] + sh.wg.l[team][3][h];
  }
  // The thread's dims 32j + 4g .. + 3 of group p for head hi, times f: slab 0's rows g, g + 8, then
  // slab 1's.
  const int tt = 32 * j + lane;
  const auto values = [&](int p, int hi, float f) {
    const int r = 4 * (hi >> 1) + (hi & 1);
    return make_float4(o[p][0][r] * f, o[p][0][r + 2] * f, o[p][1][r] * f, o[p][1][r + 2] * f);
  };
  static_assert(sizeof(TeamPart) <= sizeof(sh.rows[0]), "the first team's part fits in a stage");
  TeamPart& team_part = *reinterpret_cast<TeamPart*>(sh.rows[(n_tiles > 0 ? (n_tiles - 1) / kTeams * kTeams : 0) % kStages]);
  if (team + 1 < kTeams) {  // the first of two teams: its part to the last, then only the barriers
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
      for (int hi = 0; hi < 4; ++hi) team_part.o[p][hi][tt] = values(p, hi, s_ref);
    if (j == 0 && g == 0)
#pragma unroll
      for (int hi = 0; hi < 4; ++hi) {
        const int h = head(hi);
        team_part.m[h] = m_run[hi];
        team_part.l[h] = l[hi];
      }
    asm volatile("bar.arrive 3, %0;\n" ::"n"(32 * kConsumers) : "memory");
    asm volatile("barrier.cluster.wait;\n" ::: "memory");
    cluster_sync();
    return;
  }
  float f[4];  // the factor of this team's o, for the CTA's part relative to exp2(m_run)
#pragma unroll
  for (int hi = 0; hi < 4; ++hi) f[hi] = s_ref;
  if (kTeams > 1) {  // fold the first team's part in
    asm volatile("bar.sync 3, %0;\n" ::"n"(32 * kConsumers) : "memory");
    float w[4];  // the first team's weight
#pragma unroll
    for (int hi = 0; hi < 4; ++hi) {
      const int h = head(hi);
      const float m0 = team_part.m[h], m = fmaxf(m0, m_run[hi]);
      w[hi] = exp2_approx(m0 - m);
      f[hi] *= exp2_approx(m_run[hi] - m);
      l[hi] = l[hi] * exp2_approx(m_run[hi] - m) + team_part.l[h] * w[hi];
      m_run[hi] = m;
    }
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
      for (int hi = 0; hi < 4; ++hi) {
        const int r = 4 * (hi >> 1) + (hi & 1);
        const float4 v = team_part.o[p][hi][tt];
        o[p][0][r] = o[p][0][r] * f[hi] + v.x * w[hi];
        o[p][0][r + 2] = o[p][0][r + 2] * f[hi] + v.y * w[hi];
        o[p][1][r] = o[p][1][r] * f[hi] + v.z * w[hi];
        o[p][1][r + 2] = o[p][1][r + 2] * f[hi] + v.w * w[hi];
      }
#pragma unroll
    for (int hi = 0; hi < 4; ++hi) f[hi] = 1.f;
  }
  // Each latent group to the CTA that merges it, this one's included (every CTA of the cluster has
  // started: the wait).
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int merger = p % kSplits;
    SlicePart& to = sh.parts[split];
#pragma unroll
    for (int hi = 0; hi < 4; ++hi) {
      const float4 v = values(p, hi, f[hi]);
      cluster_store4(cluster_addr(&to.o[p / kSplits][hi][tt], merger), v.x, v.y, v.z, v.w);
    }
    if (p < kSplits && j == 0 && g == 0)  // m and l once to each merger
#pragma unroll
      for (int hi = 0; hi < 4; ++hi) {
        const int h = head(hi);
        cluster_store(cluster_addr(&to.m[h], merger), m_run[hi]);
        cluster_store(cluster_addr(&to.l[h], merger), l[hi]);
      }
  }
  cluster_sync();  // every CTA's groups are in
  // Each part's weight for each head, 2^(m_c - m) / sum, and the head's lse, once a head.
  if (j == 0 && lane < kHeads) {
    const int h = lane;
    float m = -kInf, w[kSplits], sum = 0.f;
#pragma unroll
    for (int c = 0; c < kSplits; ++c) m = fmaxf(m, sh.parts[c].m[h]);
#pragma unroll
    for (int c = 0; c < kSplits; ++c) {
      w[c] = exp2_approx(sh.parts[c].m[h] - m);  // a part with no valid token: m = -1e30, l = 0
      sum += w[c] * sh.parts[c].l[h];
    }
    const float inv_l = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int c = 0; c < kSplits; ++c) sh.wg.weight[c][h] = w[c] * inv_l;
    if (split == 0 && h < H) out_lse[(long long)b * H + h] = sum > 0.f ? (m + log2f(sum)) * 0.6931471805599453f : -kInf;
  }
  team_sync(team);
  // This CTA's groups from every part -> out [b, :H, dims] bf16, a head a turn, the loop rolled:
  // code that runs once a CTA comes cold from memory (unrolled, the combine took 1.4 us).
#pragma unroll 1
  for (int hi = 0; hi < 4; ++hi) {
    const int h = head(hi);
    if (h >= H) continue;
#pragma unroll
    for (int gl = 0; gl < kGroupsMerged; ++gl) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int c = 0; c < kSplits; ++c) {
        const float w = sh.wg.weight[c][h];
        const float4 v = sh.parts[c].o[gl][hi][tt];
        acc.x += v.x * w; acc.y += v.y * w; acc.z += v.z * w; acc.w += v.w * w;
      }
      *reinterpret_cast<uint2*>(out + ((long long)b * H + h) * 512 + 128 * (split + kSplits * gl) + 32 * j + 4 * g) =
          make_uint2(pack_bf16x2(acc.x, acc.y), pack_bf16x2(acc.z, acc.w));
    }
  }
}
#endif

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, SPARSE_MLA_CTAS_PER_SM) __cluster_dims__(kSplits, 1, 1)
sparse_mla_decode(const unsigned short* __restrict__ q, const unsigned char* __restrict__ cache,
                  const int* __restrict__ topk, unsigned short* __restrict__ out, float* __restrict__ out_lse,
                  int B, int H, int K, int k_per_split, float qk_scale_log2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
#if SPARSE_MLA_WGMMA
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
#else
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates: groupID, thread in group
  const int split = blockIdx.x, b = blockIdx.y;
  const int k_begin = split * k_per_split;
  const int k_count = max(0, min(k_per_split, K - k_begin));
  const int n_tiles = (k_count + kTile - 1) / kTile;

  // Launched as a programmatic dependent: the next kernel on the stream may take its places from
  // now on, and this one touches global memory only once the previous kernel is done.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (tid < kStages) {
    mbar_init(&sh.full[tid], kFullArrivals);
    mbar_init(&sh.empty[tid], kWarps);
  }
  __syncthreads();
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // A CTA's shared memory may be written by the cluster only once the CTA runs: every thread arrives
  // then and waits before its first remote store.
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  if (warp >= kConsumers) {
#if SPARSE_MLA_WGMMA
    if (kSplitRegisters) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
#endif
    produce(sh, cache, topk + (long long)b * K + k_begin, k_count, n_tiles, lane, warp - kConsumers);
    asm volatile("barrier.cluster.wait;\n" ::: "memory");
    cluster_sync();  // every part is in
#if !SPARSE_MLA_WGMMA
    merge_parts(sh, out, out_lse, b, H, split, tid);
#endif
    return;
  }
  const int w = warp % kWarps, team = warp / kWarps;  // latent group w; team takes tiles team, team + kTeams, ...
#if SPARSE_MLA_WGMMA
  if (kSplitRegisters) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  stage_q(sh, q, b, H, tid);
  asm volatile("bar.sync 15, %0;\n" ::"n"(32 * kConsumers) : "memory");  // q is staged
  consume_wgmma(sh, out, out_lse, b, H, n_tiles, team, w, lane, split, qk_scale_log2);
#else

  // q's B fragments for group w: head g (and g + 8), dims 128w + 32t + [0, 32) as fp16 pairs; in
  // k-step s, logical rows (2t, 2t+1) are dims +4s, +4s+1 and (2t+8, 2t+9) dims +4s+2, +4s+3.
  unsigned q_lo[16], q_hi[16], rope_lo[2], rope_hi[2];
  {
    const auto load_head = [&](int h, unsigned (&frag)[16], unsigned (&rope)[2]) {
      if (h >= H) {
        #pragma unroll
        for (int i = 0; i < 16; ++i) frag[i] = 0;
        rope[0] = rope[1] = 0;
        return;
      }
      const unsigned short* qh = q + ((long long)b * H + h) * 576;
      const uint4* src = reinterpret_cast<const uint4*>(qh + 128 * w + 32 * t);
      #pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = src[i];
        frag[4 * i] = bf16x2_to_f16x2(v.x); frag[4 * i + 1] = bf16x2_to_f16x2(v.y);
        frag[4 * i + 2] = bf16x2_to_f16x2(v.z); frag[4 * i + 3] = bf16x2_to_f16x2(v.w);
      }
      // The rope's k-step w (dims 16w..16w+15), plain order, bf16.
      rope[0] = *reinterpret_cast<const unsigned*>(qh + 512 + 16 * w + 2 * t);
      rope[1] = *reinterpret_cast<const unsigned*>(qh + 512 + 16 * w + 8 + 2 * t);
    };
    load_head(g, q_lo, rope_lo);
    load_head(kHeadTiles == 2 ? g + 8 : H, q_hi, rope_hi);
  }

  float o[8][kHeadTiles][4];  // O^T: m-tile j = dims 128w + 16g + 2j (rows g) and +1 (rows g + 8)
  #pragma unroll
  for (int j = 0; j < 8; ++j)
    #pragma unroll
    for (int n = 0; n < kHeadTiles; ++n) o[j][n][0] = o[j][n][1] = o[j][n][2] = o[j][n][3] = 0.f;
  float m_run[2] = {-1e30f, -1e30f}, l_run[2] = {0.f, 0.f};  // heads g and g + 8
  float s_ref = 0.f, inv_ref = 0.f;  // o holds output / s_ref

  for (int i = team; i < n_tiles; i += kTeams) {
    const int stage = i % kStages;
    const unsigned char* rows = landed(sh, i);

    // S partial of group w, tokens as the MMA's M: m-tile m holds tokens 16m + g (c0, c1) and
    // 16m + g + 8 (c2, c3), heads 2t, 2t+1 of head tile r; stored as partial[head][token].
    float* mine = sh.partial[team][(i / kTeams) & 1][w];
    #pragma unroll
    for (int m = 0; m < kTile / 16; ++m) {
      const unsigned char* row0 = rows + (16 * m + g) * kRowBytes;
      const unsigned char* row1 = row0 + 8 * kRowBytes;
      unsigned words0[8], words1[8];
      load32(row0 + 128 * w + 32 * t, words0);
      load32(row1 + 128 * w + 32 * t, words1);
      // Two accumulator chains (even and odd k-steps): dependent MMAs wait out each other's latency.
      float acc[2][kHeadTiles][4] = {}, rope_acc[kHeadTiles][4] = {};
      #pragma unroll
      for (int k = 0; k < 8; ++k) {
        const unsigned a0 = e4m3x2_lo(words0[k]), a1 = e4m3x2_lo(words1[k]);
        const unsigned a2 = e4m3x2_hi(words0[k]), a3 = e4m3x2_hi(words1[k]);
        mma_f16(acc[k & 1][0], a0, a1, a2, a3, q_lo[2 * k], q_lo[2 * k + 1]);
        if (kHeadTiles == 2) mma_f16(acc[k & 1][kHeadTiles - 1], a0, a1, a2, a3, q_hi[2 * k], q_hi[2 * k + 1]);
      }
      const unsigned r0 = *reinterpret_cast<const unsigned*>(row0 + kRopeOffset + 32 * w + 4 * t);
      const unsigned r1 = *reinterpret_cast<const unsigned*>(row1 + kRopeOffset + 32 * w + 4 * t);
      const unsigned r2 = *reinterpret_cast<const unsigned*>(row0 + kRopeOffset + 32 * w + 16 + 4 * t);
      const unsigned r3 = *reinterpret_cast<const unsigned*>(row1 + kRopeOffset + 32 * w + 16 + 4 * t);
      mma_bf16(rope_acc[0], r0, r1, r2, r3, rope_lo[0], rope_lo[1]);
      if (kHeadTiles == 2) mma_bf16(rope_acc[kHeadTiles - 1], r0, r1, r2, r3, rope_hi[0], rope_hi[1]);
      const float scale0 = *reinterpret_cast<const float*>(row0 + kScaleOffset + 4 * w);
      const float scale1 = *reinterpret_cast<const float*>(row1 + kScaleOffset + 4 * w);
      #pragma unroll
      for (int r = 0; r < kHeadTiles; ++r) {
        float* head0 = mine + (8 * r + 2 * t) * kPartialStride + 16 * m + g;
        head0[0] = (acc[0][r][0] + acc[1][r][0]) * scale0 + rope_acc[r][0];
        head0[kPartialStride] = (acc[0][r][1] + acc[1][r][1]) * scale0 + rope_acc[r][1];
        head0[8] = (acc[0][r][2] + acc[1][r][2]) * scale1 + rope_acc[r][2];
        head0[kPartialStride + 8] = (acc[0][r][3] + acc[1][r][3]) * scale1 + rope_acc[r][3];
      }
    }
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + team), "n"(32 * kWarps) : "memory");  // the team's partials are in

    // The whole S (the four partials in a fixed order), masked and in log2 units, in the layout of
    // P's B fragment: s[n][0..1] head g, tokens 8n + 2t, +1; [2..3] head g + 8. scale: their s_w.
    float s[kTokenTiles][4], scale[kTokenTiles][2];
    float tile_max[2] = {-kInf, -kInf};
    #pragma unroll
    for (int n = 0; n < kTokenTiles; ++n) {
      const int2 slot = *reinterpret_cast<const int2*>(sh.slots[stage] + 8 * n + 2 * t);
      const unsigned char* tok = rows + (8 * n + 2 * t) * kRowBytes + kScaleOffset + 4 * w;
      scale[n][0] = *reinterpret_cast<const float*>(tok);
      scale[n][1] = *reinterpret_cast<const float*>(tok + kRowBytes);
      #pragma unroll
      for (int r = 0; r < kHeadTiles; ++r) {
        float2 sum = make_float2(0.f, 0.f);
        #pragma unroll
        for (int v = 0; v < kWarps; ++v) {
          const float2 p = *reinterpret_cast<const float2*>(sh.partial[team][(i / kTeams) & 1][v] + (g + 8 * r) * kPartialStride + 8 * n + 2 * t);
          sum.x += p.x;
          sum.y += p.y;
        }
        s[n][2 * r] = slot.x >= 0 ? sum.x * qk_scale_log2 : -kInf;
        s[n][2 * r + 1] = slot.y >= 0 ? sum.y * qk_scale_log2 : -kInf;
        tile_max[r] = fmaxf(tile_max[r], fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      }
      scale[n][0] = slot.x >= 0 ? scale[n][0] : 0.f;
      scale[n][1] = slot.y >= 0 ? scale[n][1] : 0.f;
    }
    float alpha[2], tile_sum[2] = {0.f, 0.f};
    #pragma unroll
    for (int r = 0; r < kHeadTiles; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m_run[r], tile_max[r]);
      alpha[r] = exp2_approx(m_run[r] - m_new);
      m_run[r] = m_new;
    }
    // o's unit s_ref: the first tile's largest s_w, raised only when a tile's scales outgrow it by
    // 2^8, so P s_w / s_ref stays well inside fp16's range and o is rarely rescaled for it.
    float tile_ref = 0.f;
    #pragma unroll
    for (int n = 0; n < kTokenTiles; ++n) tile_ref = fmaxf(tile_ref, fmaxf(scale[n][0], scale[n][1]));
    tile_ref = fmaxf(tile_ref, __shfl_xor_sync(0xffffffffu, tile_ref, 1));
    tile_ref = fmaxf(tile_ref, __shfl_xor_sync(0xffffffffu, tile_ref, 2));
    float unit_ratio = 1.f;  // old unit / new unit
    if (tile_ref > 256.f * s_ref) {  // the same in every lane
      unit_ratio = s_ref / tile_ref;
      s_ref = tile_ref;
      inv_ref = 1.f / tile_ref;
    }
    unsigned p_frag[kTokenTiles][kHeadTiles];  // B fragments of P.V: head g (+8), tokens 8n + 2t, +1
    #pragma unroll
    for (int n = 0; n < kTokenTiles; ++n) {
      const float w0 = scale[n][0] * inv_ref, w1 = scale[n][1] * inv_ref;
      #pragma unroll
      for (int r = 0; r < kHeadTiles; ++r) {
        const float p0 = exp2_approx(s[n][2 * r] - m_run[r]), p1 = exp2_approx(s[n][2 * r + 1] - m_run[r]);
        tile_sum[r] += p0 + p1;
        p_frag[n][r] = pack_f16x2(p0 * w0, p1 * w1);
      }
    }
    #pragma unroll
    for (int r = 0; r < kHeadTiles; ++r) {
      tile_sum[r] += __shfl_xor_sync(0xffffffffu, tile_sum[r], 1);
      tile_sum[r] += __shfl_xor_sync(0xffffffffu, tile_sum[r], 2);
      l_run[r] = l_run[r] * alpha[r] + tile_sum[r];
    }
    // Rescale o when a running max grew or the unit changed. O's columns are heads 2t, 2t+1 (+8):
    // their alphas live in lanes 8t and 8t + 4.
    bool grew = false;
    #pragma unroll
    for (int r = 0; r < kHeadTiles; ++r) grew |= alpha[r] != 1.f;
    if (__any_sync(0xffffffffu, grew) || unit_ratio != 1.f) {
      #pragma unroll
      for (int r = 0; r < kHeadTiles; ++r) {
        const float f0 = __shfl_sync(0xffffffffu, alpha[r], 8 * t) * unit_ratio;
        const float f1 = __shfl_sync(0xffffffffu, alpha[r], 8 * t + 4) * unit_ratio;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
          o[j][r][0] *= f0; o[j][r][1] *= f1; o[j][r][2] *= f0; o[j][r][3] *= f1;
        }
      }
    }

    // O^T += V8^T P'^T over k16 chunks of tokens: rows 16c + 2t, +1 (k 2t, 2t+1) and +8, +9.
    #pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const unsigned char* base = rows + (16 * c + 2 * t) * kRowBytes + 128 * w + 16 * g;
      const uint4 x = *reinterpret_cast<const uint4*>(base);
      const uint4 y = *reinterpret_cast<const uint4*>(base + kRowBytes);
      const uint4 z = *reinterpret_cast<const uint4*>(base + 8 * kRowBytes);
      const uint4 u = *reinterpret_cast<const uint4*>(base + 9 * kRowBytes);
      const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
      const unsigned zs[4] = {z.x, z.y, z.z, z.w}, us[4] = {u.x, u.y, u.z, u.w};
      #pragma unroll
      for (int j = 0; j < 8; ++j) {
        // Bytes 2j, 2j+1 of the lane's 16: (token 2t, token 2t+1) pairs of dims 16g + 2j and + 1.
        const unsigned sel = (j & 1) ? 0x7362u : 0x5140u;
        const unsigned xy = byte_perm(xs[j >> 1], ys[j >> 1], sel);
        const unsigned zu = byte_perm(zs[j >> 1], us[j >> 1], sel);
        const unsigned a0 = e4m3x2_lo(xy), a1 = e4m3x2_hi(xy), a2 = e4m3x2_lo(zu), a3 = e4m3x2_hi(zu);
        #pragma unroll
        for (int r = 0; r < kHeadTiles; ++r) mma_f16(o[j][r], a0, a1, a2, a3, p_frag[2 * c][r], p_frag[2 * c + 1][r]);
      }
    }
    __syncwarp();  // every lane's reads of the stage are done
    if (lane == 0) mbar_arrive(&sh.empty[stage]);
  }

  // Send o s_ref (the output unnormalized, relative to exp2(m)), m and l of latent group w to the
  // CTA that merges it.
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
  MergeIn& in = sh.merge;
  const unsigned merger = w % kSplits;
  const int gl = w / kSplits, part = split * kTeams + team;
  #pragma unroll
  for (int r = 0; r < kHeadTiles; ++r) {
    const int h0 = 8 * r + 2 * t;  // this thread holds dims 16g .. 16g + 15 of heads h0 and h0 + 1
    const unsigned to0 = cluster_addr(&in.o[gl][part][h0][16 * g], merger);
    const unsigned to1 = cluster_addr(&in.o[gl][part][h0 + 1][16 * g], merger);
    #pragma unroll
    for (int j = 0; j < 8; j += 2) {
      cluster_store4(to0 + 8 * j, o[j][r][0] * s_ref, o[j][r][2] * s_ref, o[j + 1][r][0] * s_ref, o[j + 1][r][2] * s_ref);
      cluster_store4(to1 + 8 * j, o[j][r][1] * s_ref, o[j][r][3] * s_ref, o[j + 1][r][1] * s_ref, o[j + 1][r][3] * s_ref);
    }
    if (t == 0) {
      cluster_store(cluster_addr(&in.m[gl][part][g + 8 * r], merger), m_run[r]);
      cluster_store(cluster_addr(&in.l[gl][part][g + 8 * r], merger), l_run[r]);
    }
  }
  cluster_sync();  // every part is in
  merge_parts(sh, out, out_lse, b, H, split, tid);
#endif
}

// Dynamic shared memory the kernel needs, read by the launcher (cuModuleGetGlobal).
extern "C" __device__ const int sparse_mla_decode_shared_bytes = sizeof(Shared) + (SPARSE_MLA_WGMMA ? 1024 : 0);  // + the alignment slack
