// Sparse MLA decode for many heads (a CTA takes 64) on Hopper's warpgroup MMA (wgmma, sm_90a).
//
// Same contract as sparse_mla.sparse_mla_decode_reference: q [B, H, 576] bf16, a cache of
// 656-byte fp8_ds_mla rows (512 e4m3 latent, 4 fp32 group scales, 64 bf16 rope), top-k slots
// [B, K] (-1 = none) -> out [B, H, 512] bf16 and lse [B, H] fp32 (base e). A request's top-k list
// is cut into SPARSE_MLA_SPLITS slices, one CTA each (1, 2, 4 or 8: one thread-block cluster),
// which merge their outputs through distributed shared memory at the end (no second kernel, and
// no bf16 rounding of partial outputs): CTA c writes output columns block c, so each thread keeps
// its O^T values of its own CTA's block in registers and stores the rest into their CTA's shared
// memory, at slots that keep a warp's stores contiguous (4-way bank conflicts there cost 2.5 us).
//
// Tokens are the MMAs' M, so that a tile's rows reach wgmma's A operand from registers, straight
// from their e4m3 bytes: no bf16 or fp16 copy of a tile is ever stored in shared memory.
//   S^T [64 tokens x 64 heads] = K q^T: A = the rows, read by ldmatrix from the raw tile and
//     converted e4m3 -> f16 (exact); B = q in shared memory (the latent in f16, each 16-dim
//     step's columns in the order ldmatrix delivers the bytes; the rope bf16). Each latent
//     group's partial is scaled per token, a row of S^T, in fp32 by Horner's rule
//     (acc = rope, acc = acc / s0 + P0, acc = acc s0/s1 + P1, ..., acc s3 x the softmax scale),
//     so the scores are as exact as fp32: keys scaled into f16 would move the lse by up to 6e-5.
//     A group's two halves (4 k-steps each) take turns in two register buffers: one half's rows
//     are read and converted while the MMAs of the half before run, so only the Horner waits are
//     exposed.
//   O^T [256 dims x 64 heads] += V^T P^T, in each consumer warpgroup: A = V^T built in registers
//     from the same rows (byte pairs of two tokens by prmt, e4m3 -> f16, times the token's group
//     scale as an f16 mantissa and an f16 power of two), B = P^T, which the tile's owner stores
//     transposed by stmatrix.
// Warpgroup 2, the producer, moves each of a tile's rows by one bulk copy (the copy engine, onto
// the stage's mbarrier) into a ring of three stages, from the start: the consumers stage q
// meanwhile, all of its loads in flight at once. (16-B cp.async copies, 41 a row, take issue
// slots and the LSU queue from the consumers: 1.6 us more.)
// Warpgroups 0 and 1 take the tiles in turn: the owner of a tile computes S^T and the softmax and
// hands P^T and the running max over; both add the tile to their half of O^T (dims 0-255 and
// 256-511). The running max of a head moves only when a tile's exceeds it by 2^8, so O is rarely
// rescaled. setmaxnreg: 240 registers for each consumer (O^T takes 128), 24 for the producer.
// No headers: NVRTC compiles it at run time (longctx_kernels.cuda_module).

#ifndef SPARSE_MLA_SPLITS
#define SPARSE_MLA_SPLITS 1  // slices of a request's list: the cluster's CTAs
#endif
namespace {

constexpr int kTile = 64;                // tokens a tile: M of S^T, K of P.V
constexpr int kHeads = 64;               // N of both MMAs
constexpr int kRowBytes = 656;
constexpr int kStages = 3;               // raw row tiles in the ring
constexpr int kThreads = 384;
constexpr int kGroupThreads = 128;
constexpr int kQBytes = 9 * kHeads * 128;
constexpr int kRawBytes = kTile * kRowBytes;
constexpr int kPBytes = kHeads * 128;    // P^T [64 heads x 64 tokens] f16, one 128-B swizzled block
constexpr float kSlack = 8.f;
#define kInf __int_as_float(0x7f800000)
constexpr float kNoMax = -1e30f;
constexpr int kSplits = SPARSE_MLA_SPLITS;
constexpr int kReady = 1;                // + w: warpgroup w's tile handed over (P^T, the max)
constexpr int kOwnGroup = 3;             // + w: warpgroup w's own barrier
constexpr int kConsumers = 5;            // both consumer warpgroups
static_assert(kSplits == 1 || kSplits == 2 || kSplits == 4 || kSplits == 8, "whole 64-column blocks a CTA, at most a portable cluster");

struct Shared {
  unsigned char q[kQBytes];
  unsigned char raw[kStages][kRawBytes];
  unsigned char p[3][kPBytes];           // P^T of tiles i % 3: the one handed over, this one, the next
  float m_ref[kHeads];
  float alpha[3][kHeads];                // O's factor where tile i moved the max
  int moved[3];
  int valid[kStages][kTile];             // the producer's: which rows of a stage hold a token
  float tmax[2][4][kHeads];
  float lsum[2][4][kHeads];
  unsigned long long full[kStages];
  unsigned long long empty[kStages];
};
struct Part {                            // what one slice hands each other slice
  float4 o[16][2][2 * kGroupThreads / kSplits];  // [head e][dims 0-3, 4-7][sender slot]
  float m[kHeads];
  float l[kHeads];
};
struct Exchange {
  Part part[kSplits];
};
static_assert(sizeof(Exchange) <= kQBytes + kStages * kRawBytes, "the exchange fits");
static_assert(kSplits * kHeads <= 2 * 4 * kHeads, "the merge weights fit in tmax");

#include "barriers.cuh"
#include "wgmma.cuh"
#include "numeric.cuh"

__device__ __forceinline__ unsigned long long descriptor(unsigned addr, unsigned lead, unsigned stride) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (static_cast<unsigned long long>(lead >> 4) << 16) |
         (static_cast<unsigned long long>(stride >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ unsigned long long advance(unsigned long long desc, unsigned bytes) {
  return (desc & 0xffffffff00000000ull) | (static_cast<unsigned>(desc) + (bytes >> 4));
}
__device__ __forceinline__ unsigned hmul2(unsigned a, unsigned b) {
  unsigned out;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(out) : "r"(a), "r"(b));
  return out;
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}
__device__ __forceinline__ uint2 load_shared_u2(unsigned addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ float4 load_shared_f4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void store_shared(unsigned addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ int bar_or(int id, int count, int pred) {
  int out;
  asm volatile("{\n .reg .pred p, q;\n setp.ne.b32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.b32 %0, 1, 0, q;\n}\n"
               : "=r"(out) : "r"(pred), "r"(id), "r"(count) : "memory");
  return out;
}
__device__ __forceinline__ float lse_of(float m, float sum) {
  return sum > 0.f ? (m + log2_approx(sum)) * 0.6931471805599453f : -kInf;
}

#define ACC32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
  "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),     \
  "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]),    \
  "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
// D[64 x 64] (+)= A[64 x 16] . B[64 x 16]^T: A from registers, B K-major in shared memory.
__device__ __forceinline__ void wgmma_rs_f16(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int accumulate) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " REGS32
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : ACC32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs_bf16(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int accumulate) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " REGS32
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : ACC32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// q as S^T's B operand, by the consumers' 256 threads (every load in flight before the first
// store): the latent in f16, each 16-dim step's columns in the order the e4m3 rows reach the A
// operand (dims 0,1,4,5,8,9,12,13 then 2,3,6,7,...); the rope bf16 as it is.
__device__ __forceinline__ void stage_q(unsigned base, const unsigned short* q, int b, int H, int head0, int t) {
  constexpr int kSteps = 36;  // 16-dim steps of a head's 576
  constexpr int kItems = kHeads * kSteps / (2 * kGroupThreads);
  static_assert(kItems * 2 * kGroupThreads == kHeads * kSteps, "whole steps a thread");
  uint4 v[kItems][2];
#pragma unroll
  for (int n = 0; n < kItems; ++n) {
    const int i = t + n * 2 * kGroupThreads, r = i / kSteps, j = i % kSteps;
    const bool ok = head0 + r < H;
    const uint4* src = reinterpret_cast<const uint4*>(q + (static_cast<long long>(b) * H + (ok ? head0 + r : 0)) * 576) + 2 * j;
    v[n][0] = ok ? src[0] : make_uint4(0u, 0u, 0u, 0u);
    v[n][1] = ok ? src[1] : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int n = 0; n < kItems; ++n) {
    const int i = t + n * 2 * kGroupThreads, r = i / kSteps, j = i % kSteps;
    const uint4 v0 = v[n][0], v1 = v[n][1];
    if (j < 32) {
      store_shared(base + swizzled(kHeads, r, 2 * j), make_uint4(bf16x2_to_f16x2(v0.x), bf16x2_to_f16x2(v0.z), bf16x2_to_f16x2(v1.x), bf16x2_to_f16x2(v1.z)));
      store_shared(base + swizzled(kHeads, r, 2 * j + 1), make_uint4(bf16x2_to_f16x2(v0.y), bf16x2_to_f16x2(v0.w), bf16x2_to_f16x2(v1.y), bf16x2_to_f16x2(v1.w)));
    } else {
      store_shared(base + swizzled(kHeads, r, 2 * j), v0);
      store_shared(base + swizzled(kHeads, r, 2 * j + 1), v1);
    }
  }
}

// This CTA's slice of the list [begin, end) and its tiles, from the launch's values at each call
// (the consumers ask each tile: a register held through their loop is one the loop does not have).
struct Slice {
  int begin, end, tiles;
};
__device__ __forceinline__ Slice slice_of(int K, int k_per_split) {
  unsigned split;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(split));
  const int begin = split * k_per_split, end = min(K, begin + k_per_split);
  return {begin, end, end > begin ? (end - begin + kTile - 1) / kTile : 0};
}

// The four group scales of this thread's rows of a tile (S^T's M): 16 warp + lane / 4 and + 8.
struct RowScales {
  float s[2][4];
};

// S^T for the tile at `raw` (shared address), this warp's 16 tokens, times the softmax scale (log2):
// the rope, then the four latent groups by Horner's rule in fp32 (k exact in f16, each group's
// partial scaled per token: rows). A group is two halves of 4 k-steps in two register buffers: a
// half's rows are read and converted while the MMAs of the one before run, so only the Horner waits
// are exposed.
__device__ __forceinline__ void scores(float (&d)[32], unsigned raw, unsigned long long qd, int warp, int lane, const RowScales& sc, float scale_log2) {
  const int tok = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
  const unsigned row_addr = raw + tok * kRowBytes + 16 * (lane >> 4);
  float step_up[4][2];  // 1 / s_0, then s_g / s_{g+1}; 0 where the row has none
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    step_up[0][r] = sc.s[r][0] > 0.f ? __fdividef(1.f, sc.s[r][0]) : 0.f;
#pragma unroll
    for (int g = 0; g < 3; ++g) step_up[g + 1][r] = sc.s[r][g + 1] > 0.f ? __fdividef(sc.s[r][g], sc.s[r][g + 1]) : 0.f;
  }
  unsigned a[2][4][4];
  // Half h (0-7) is k-steps 4 (h % 2) .. + 3 of group h / 2. ldmatrix gives a thread 4 bytes
  // (dims 4c .. 4c + 3 of a 16-dim step, c = lane % 4) of a row: the low pair is the A operand's
  // columns 2c, 2c + 1, the high pair 2c + 8, 2c + 9 (q's order).
  auto load_half = [&](unsigned (&f)[4][4], int h) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      unsigned r[4];
      ldmatrix_x4(r, row_addr + 128 * (h / 2) + 64 * (h % 2) + 32 * p);
      f[2 * p][0] = e4m3x2_lo(r[0]);
      f[2 * p][2] = e4m3x2_hi(r[0]);
      f[2 * p][1] = e4m3x2_lo(r[1]);
      f[2 * p][3] = e4m3x2_hi(r[1]);
      f[2 * p + 1][0] = e4m3x2_lo(r[2]);
      f[2 * p + 1][2] = e4m3x2_hi(r[2]);
      f[2 * p + 1][1] = e4m3x2_lo(r[3]);
      f[2 * p + 1][3] = e4m3x2_hi(r[3]);
    }
  };
  // The rope: bf16 as stored, natural order; lanes 16-31 give dims 8-15 of a step.
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    unsigned r[4];
    ldmatrix_x4(r, raw + tok * kRowBytes + 528 + 32 * ks + 16 * (lane >> 4));
    a[0][ks][0] = r[0];
    a[0][ks][1] = r[1];
    a[0][ks][2] = r[2];
    a[0][ks][3] = r[3];
  }
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_rs_bf16(d, a[0][ks], advance(qd, 8 * kHeads * 128 + ks * 32), ks > 0);
  wgmma_commit();
  load_half(a[1], 0);
  wgmma_wait<0>();
  pin(d);
#pragma unroll
  for (int e = 0; e < 32; ++e) d[e] *= step_up[0][(e >> 1) & 1];
#pragma unroll
  for (int h = 0; h < 8; ++h) {
    const int g = h / 2;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int step = 8 * g + 4 * (h % 2) + ks;
      wgmma_rs_f16(d, a[(h + 1) % 2][ks], advance(qd, (step >> 2) * kHeads * 128 + (step & 3) * 32), 1);
    }
    wgmma_commit();
    if (h % 2 == 0) {
      load_half(a[h % 2], h + 1);  // its buffer's last MMAs were waited for by the last scaling
      continue;
    }
    if (h < 7) {
      wgmma_wait<1>();  // the other buffer free: the next group's first half into it
      load_half(a[h % 2], h + 1);
    }
    wgmma_wait<0>();
    pin(d);
#pragma unroll
    for (int e = 0; e < 32; ++e) {  // x s_g / s_{g+1} after group g, x s_3 and the scale after the last
      const int r = (e >> 1) & 1;
      d[e] *= g < 3 ? step_up[g + 1][r] : sc.s[r][3] * scale_log2;
    }
  }
}

// O^T (this warpgroup's 256 dims x 64 heads) += V^T P^T over the tile at `raw`, P^T at `pt`.
// Thread rows: m-tile m, row 16 warp + lane / 4 + 8 e <-> dim 256 half + 8 (8 warp + lane / 4) + 2 m + e.
__device__ __forceinline__ void pv(float (&o)[4][32], unsigned raw, unsigned pt, int half, int warp, int lane) {
  const int q = lane & 3;
  const int dim0 = 256 * half + 8 * (8 * warp + (lane >> 2));
  const int group = dim0 >> 7;
  const unsigned long long pd = descriptor(pt, 16, 1024);
  unsigned a[2][4][4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    if (c >= 2) wgmma_wait<1>();  // the buffer of k-step c - 2 free
    unsigned (&f)[4][4] = a[c & 1];
    const int t0 = 16 * c + 2 * q;
    uint2 x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = load_shared_u2(raw + (t0 + (u & 1) + 8 * (u >> 1)) * kRowBytes + dim0);
    // Each token's group scale as mantissa x power of two, both exact in f16 (a small scale
    // would lose its bits as an f16 subnormal): the key is (k8 x mantissa) x 2^e, rounded once
    // unless the product itself is subnormal.
    unsigned mant[2], pow2[2];
    {
      float m[4], e[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int t = t0 + (u & 1) + 8 * (u >> 1);
        unsigned bits;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(bits) : "r"(raw + t * kRowBytes + 512 + 4 * group));
        m[u] = __uint_as_float((bits & 0x807fffffu) | 0x3f800000u);
        e[u] = __uint_as_float(bits & 0x7f800000u);
      }
      mant[0] = pack_f16x2(m[0], m[1]);
      mant[1] = pack_f16x2(m[2], m[3]);
      pow2[0] = pack_f16x2(e[0], e[1]);
      pow2[1] = pack_f16x2(e[2], e[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // tokens t0, t0 + 1 (h = 0) or t0 + 8, t0 + 9
      const uint2 lo = x[2 * h], hi = x[2 * h + 1];
      // pairs (token t, t + 1) of dims 0..7
      const unsigned p01 = byte_perm(lo.x, hi.x, 0x5140), p23 = byte_perm(lo.x, hi.x, 0x7362);
      const unsigned p45 = byte_perm(lo.y, hi.y, 0x5140), p67 = byte_perm(lo.y, hi.y, 0x7362);
      const unsigned d0 = hmul2(hmul2(e4m3x2_lo(p01), mant[h]), pow2[h]), d1 = hmul2(hmul2(e4m3x2_hi(p01), mant[h]), pow2[h]);
      const unsigned d2 = hmul2(hmul2(e4m3x2_lo(p23), mant[h]), pow2[h]), d3 = hmul2(hmul2(e4m3x2_hi(p23), mant[h]), pow2[h]);
      const unsigned d4 = hmul2(hmul2(e4m3x2_lo(p45), mant[h]), pow2[h]), d5 = hmul2(hmul2(e4m3x2_hi(p45), mant[h]), pow2[h]);
      const unsigned d6 = hmul2(hmul2(e4m3x2_lo(p67), mant[h]), pow2[h]), d7 = hmul2(hmul2(e4m3x2_hi(p67), mant[h]), pow2[h]);
      // m-tile m: a[0] = (dim 2m, tokens t0, t0+1), a[1] = (dim 2m+1, ...), a[2], a[3] the same at t0 + 8.
      f[0][2 * h] = d0;
      f[0][2 * h + 1] = d1;
      f[1][2 * h] = d2;
      f[1][2 * h + 1] = d3;
      f[2][2 * h] = d4;
      f[2][2 * h + 1] = d5;
      f[3][2 * h] = d6;
      f[3][2 * h + 1] = d7;
    }
    wgmma_fence();
#pragma unroll
    for (int m = 0; m < 4; ++m) wgmma_rs_f16(o[m], f[m], advance(pd, 32 * c), 1);
    wgmma_commit();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int m = 0; m < 4; ++m) pin(o[m]);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
#if SPARSE_MLA_SPLITS > 1
__cluster_dims__(kSplits, 1, 1)
#endif
sparse_mla_wgmma(const unsigned short* __restrict__ q, const unsigned char* __restrict__ cache, const int* __restrict__ topk,
                 unsigned* __restrict__ out, float* __restrict__ out_lse, int B, int H, int K, int k_per_split,
                 float scale_log2) {
  extern __shared__ unsigned char smem_raw[];
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  const int tid = threadIdx.x, lane = tid & 31, role = tid >> 7, t = tid & 127, warp = t >> 5;

  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sh.full[s], 8);  // each producer warp twice: its rows' bytes expected, its zeros and flags stored
      mbar_init(&sh.empty[s], 8);
    }
  }
  if (tid < kHeads) sh.m_ref[tid] = kNoMax;
  __syncthreads();  // the ring's barriers initialized
  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  if (role == 2) {
    // The producer: lane l < 16 of warp w takes row 16 w + l of every tile, its slot read a tile
    // ahead; a missing row (slot -1) is zeros stored by the warp, so that P.V's 0 x V stays 0.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    // This CTA's slice of the list (computed after setmaxnreg: nothing lives across it).
    const Slice slice = slice_of(K, k_per_split);
    const int n_tiles = slice.tiles;
    const int* slots_of_b = topk + static_cast<long long>(blockIdx.y) * K;
    auto slot_of = [&](int tile, int row) {
      const int kk = slice.begin + tile * kTile + row;
      return tile < n_tiles && kk < slice.end ? slots_of_b[kk] : -1;
    };
    const int row = 16 * warp + (lane & 15);
    const bool copier = lane < 16;
    int next_slot = slot_of(0, row);  // read a tile ahead
    for (int i = 0; i < n_tiles; ++i) {
      const int stage = i % kStages;
      const int cur = next_slot;
      next_slot = slot_of(i + 1, row);
      if (i >= kStages) mbar_wait(&sh.empty[stage], ((i / kStages) + 1) & 1);
      const unsigned real = __ballot_sync(0xffffffffu, copier && cur >= 0);
      const unsigned full = smem_addr(&sh.full[stage]);
      if (lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full), "r"(__popc(real) * kRowBytes) : "memory");
      if (copier && cur >= 0)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     ::"r"(smem_addr(sh.raw[stage] + row * kRowBytes)),
                     "l"(cache + static_cast<unsigned long long>(cur) * kRowBytes), "n"(kRowBytes), "r"(full) : "memory");
      // Missing rows, 16 B a lane.
      for (unsigned missing = __ballot_sync(0xffffffffu, copier && cur < 0); missing; missing &= missing - 1) {
        unsigned char* zeros = sh.raw[stage] + (16 * warp + __ffs(missing) - 1) * kRowBytes;
        *reinterpret_cast<uint4*>(zeros + 16 * lane) = make_uint4(0u, 0u, 0u, 0u);
        if (lane < kRowBytes / 16 - 32) *reinterpret_cast<uint4*>(zeros + 512 + 16 * lane) = make_uint4(0u, 0u, 0u, 0u);
      }
      if (copier) sh.valid[stage][row] = cur >= 0;
      __syncwarp();  // the warp's zeros and flags, then one arrival for them
      if (lane == 0) mbar_arrive(&sh.full[stage]);
    }
    if (kSplits > 1) {
      cluster_sync();
      cluster_sync();
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    // q into shared memory while the producer's first tiles are on their way.
    stage_q(smem_addr(sh.q), q, blockIdx.y, H, blockIdx.z * kHeads, tid);
    fence_async_shared();
    bar_sync(kConsumers, 2 * kGroupThreads);
    const int other = role ^ 1, qq = lane & 3;
    float o[4][32];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int e = 0; e < 32; ++e) o[m][e] = 0.f;
    float l[16];  // this warpgroup's tiles: head 8 j + 2 qq + x at 2 j + x, over the thread's rows
#pragma unroll
    for (int e = 0; e < 16; ++e) l[e] = 0.f;
    const unsigned long long qd = descriptor(smem_addr(sh.q), 16, 1024);
    // O (or this warpgroup's sums) to the max that tile `tile` moved to, where it moved.
    auto rescale_o = [&](int tile) {
      if (sh.moved[tile % 3]) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const float al = sh.alpha[tile % 3][8 * j + 2 * qq + x];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              o[m][4 * j + x] *= al;
              o[m][4 * j + 2 + x] *= al;
            }
          }
      }
    };
    auto rescale_l = [&](int tile) {
      if (sh.moved[tile % 3]) {
#pragma unroll
        for (int e = 0; e < 16; ++e) l[e] *= sh.alpha[tile % 3][8 * (e >> 1) + 2 * qq + (e & 1)];
      }
    };
    for (int i = role;; i += 2) {
      const int n_tiles = slice_of(K, k_per_split).tiles;
      if (i > n_tiles) break;
      float d[32];
      const bool mine = i < n_tiles;
      int valid0 = 0, valid1 = 0;
      if (mine) {
        const int stage = i % kStages;
        const unsigned raw = smem_addr(sh.raw[stage]);
        mbar_wait(&sh.full[stage], (i / kStages) & 1);
        const int r0 = 16 * warp + (lane >> 2);
        valid0 = sh.valid[stage][r0];
        valid1 = sh.valid[stage][r0 + 8];
        RowScales sc;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float4 v = load_shared_f4(raw + (r0 + 8 * r) * kRowBytes + 512);
          sc.s[r][0] = v.x;
          sc.s[r][1] = v.y;
          sc.s[r][2] = v.z;
          sc.s[r][3] = v.w;
        }
        scores(d, raw, qd, warp, lane, sc, scale_log2);
      }
      // The other warpgroup's tile i - 1 handed over (its P^T, max and factor): its P.V.
      const bool prev = i > 0 && i - 1 < n_tiles;
      if (prev) {
        bar_sync(kReady + other, 2 * kGroupThreads);
        rescale_l(i - 1);
        rescale_o(i - 1);
        pv(o, smem_addr(sh.raw[(i - 1) % kStages]), smem_addr(sh.p[(i - 1) % 3]), role, warp, lane);
        if (lane == 0) mbar_arrive(&sh.empty[(i - 1) % kStages]);
      }
      int moved = 0;
      if (mine) {
        float m[16];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 v = *reinterpret_cast<const float2*>(&sh.m_ref[8 * j + 2 * qq]);
          m[2 * j] = v.x;
          m[2 * j + 1] = v.y;
        }
        int over = 0;
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          const bool ok = (e & 2) ? valid1 : valid0;
          d[e] = ok ? d[e] : -kInf;
          over |= d[e] > m[2 * (e >> 2) + (e & 1)] + kSlack;
        }
        moved = bar_or(kOwnGroup + role, kGroupThreads, over);
        if (moved) {
          // The tile's max per head: the thread's two rows, the warp's, the warpgroup's.
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
              float v = fmaxf(d[4 * j + x], d[4 * j + 2 + x]);
              v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
              v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
              v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
              if (lane < 4) sh.tmax[role][warp][8 * j + 2 * qq + x] = v;
            }
          bar_sync(kOwnGroup + role, kGroupThreads);
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            const int h = 8 * (e >> 1) + 2 * qq + (e & 1);
            const float tm = fmaxf(fmaxf(sh.tmax[role][0][h], sh.tmax[role][1][h]), fmaxf(sh.tmax[role][2][h], sh.tmax[role][3][h]));
            const float nm = tm > m[e] + kSlack ? tm : m[e];
            const float al = exp2_approx(m[e] - nm);
            if (warp == 0 && lane < 4) {
              sh.alpha[i % 3][h] = al;
              sh.m_ref[h] = nm;
            }
            l[e] *= al;  // this warpgroup's sums and O to the new max (its last P.V is done)
#pragma unroll
            for (int mm = 0; mm < 4; ++mm) {
              o[mm][4 * (e >> 1) + (e & 1)] *= al;
              o[mm][4 * (e >> 1) + 2 + (e & 1)] *= al;
            }
            m[e] = nm;
          }
        }
        if (warp == 0 && lane == 0) sh.moved[i % 3] = moved;
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          d[e] = exp2_approx(d[e] - m[2 * (e >> 2) + (e & 1)]);
          l[2 * (e >> 2) + (e & 1)] += d[e];
        }
        // P^T of the tile, transposed by stmatrix: head rows of 64 tokens.
        const unsigned pt = smem_addr(sh.p[i % 3]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int mi = lane >> 3, ri = lane & 7;
          const int h = 8 * (2 * k + (mi >> 1)) + ri;
          stmatrix_x4_trans(pt + swizzled(kHeads, h, 2 * warp + (mi & 1)), pack_f16x2(d[8 * k], d[8 * k + 1]), pack_f16x2(d[8 * k + 2], d[8 * k + 3]),
                            pack_f16x2(d[8 * k + 4], d[8 * k + 5]), pack_f16x2(d[8 * k + 6], d[8 * k + 7]));
        }
        fence_async_shared();
        bar_arrive(kReady + role, 2 * kGroupThreads);
      }
      if (!mine) break;
      pv(o, smem_addr(sh.raw[i % kStages]), smem_addr(sh.p[i % 3]), role, warp, lane);
      if (lane == 0) mbar_arrive(&sh.empty[i % kStages]);
    }
    const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kHeads;  // read again: not held through the loop
    // Sums over every row: the thread's, the warp's (lanes of one qq), the warps', both warpgroups'.
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      float v = l[e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) sh.lsum[role][warp][8 * (e >> 1) + 2 * qq + (e & 1)] = v;
    }
    bar_sync(kConsumers, 2 * kGroupThreads);  // both warpgroups' sums in; the last max is in m_ref
    const int dim0 = 256 * role + 8 * (8 * warp + (lane >> 2));
    // The merge of the slices. A thread's 8 dims (dim0 / (512 / kSplits)) are column block
    // tid / kSenders, the output of that block's CTA: that CTA's threads keep theirs in registers,
    // the others hand theirs over at their slot (a warp's stores 512 contiguous bytes, free of bank
    // conflicts).
    constexpr int kSenders = 2 * kGroupThreads / kSplits;
    const int block = tid / kSenders, slot = tid % kSenders;
    const bool keep = block == split;
    Exchange& xc = *reinterpret_cast<Exchange*>(&sh);
    if (kSplits > 1) cluster_sync();  // every CTA's loop done: its ring and q take the exchange
    if (!keep) {
      constexpr unsigned kHeadBytes = sizeof(Part::o[0]);
      const unsigned dst = cluster_addr(&xc.part[split].o[0][0][slot], block);
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int j = e >> 1, x = e & 1;
        const unsigned at = dst + e * kHeadBytes;
        asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "f"(o[0][4 * j + x]), "f"(o[0][4 * j + 2 + x]),
                     "f"(o[1][4 * j + x]), "f"(o[1][4 * j + 2 + x]) : "memory");
        asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at + kHeadBytes / 2), "f"(o[2][4 * j + x]),
                     "f"(o[2][4 * j + 2 + x]), "f"(o[3][4 * j + x]), "f"(o[3][4 * j + 2 + x]) : "memory");
      }
    }
    if (tid < kHeads) {  // head tid's last max and its sum over every row, to every CTA
      float lh = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) lh += sh.lsum[0][w][tid] + sh.lsum[1][w][tid];
      const float mh = sh.m_ref[tid];
      if (kSplits == 1) {
        xc.part[0].m[tid] = mh;
        xc.part[0].l[tid] = lh;
      } else {
        for (int c = 0; c < kSplits; ++c) {
          cluster_store(cluster_addr(&xc.part[split].m[tid], c), mh);
          cluster_store(cluster_addr(&xc.part[split].l[tid], c), lh);
        }
      }
    }
    if (kSplits > 1) cluster_sync();  // every part in
    else bar_sync(kConsumers, 2 * kGroupThreads);
    // Each slice's weight for each head, 2^(m_p - top) / sum, and the head's lse, once.
    float (&weight)[kSplits][kHeads] = *reinterpret_cast<float (*)[kSplits][kHeads]>(&sh.tmax);
    if (tid < kHeads) {
      float top = kNoMax, w[kSplits];
#pragma unroll
      for (int p = 0; p < kSplits; ++p) top = fmaxf(top, xc.part[p].m[tid]);
      float sum = 0.f;
#pragma unroll
      for (int p = 0; p < kSplits; ++p) {
        w[p] = exp2_approx(xc.part[p].m[tid] - top);
        sum += w[p] * xc.part[p].l[tid];
      }
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
      for (int p = 0; p < kSplits; ++p) weight[p][tid] = w[p] * inv;
      if (split == 0 && head0 + tid < H) out_lse[static_cast<long long>(b) * H + head0 + tid] = lse_of(top, sum);
    }
    bar_sync(kConsumers, 2 * kGroupThreads);
    if (keep) {  // every load first: a head past H only skips its store
      unsigned* const row = out + ((static_cast<long long>(b) * H + head0 + 2 * qq) * 512 + dim0) / 2;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const int j = e >> 1, x = e & 1, h = 8 * j + 2 * qq + x;
        const float w = weight[split][h];
        float acc[8] = {w * o[0][4 * j + x], w * o[0][4 * j + 2 + x], w * o[1][4 * j + x], w * o[1][4 * j + 2 + x],
                        w * o[2][4 * j + x], w * o[2][4 * j + 2 + x], w * o[3][4 * j + x], w * o[3][4 * j + 2 + x]};
#pragma unroll
        for (int c = 1; c < kSplits; ++c) {
          const int p = (split + c) % kSplits;
          const float wp = weight[p][h];
          const float4 lo = xc.part[p].o[e][0][slot], hi = xc.part[p].o[e][1][slot];
          acc[0] += wp * lo.x, acc[1] += wp * lo.y, acc[2] += wp * lo.z, acc[3] += wp * lo.w;
          acc[4] += wp * hi.x, acc[5] += wp * hi.y, acc[6] += wp * hi.z, acc[7] += wp * hi.w;
        }
        if (head0 + h < H)
          *reinterpret_cast<uint4*>(row + (8 * j + x) * 256) =
              make_uint4(pack_bf16x2(acc[0], acc[1]), pack_bf16x2(acc[2], acc[3]), pack_bf16x2(acc[4], acc[5]), pack_bf16x2(acc[6], acc[7]));
      }
    }
  }
}


extern "C" __device__ const int sparse_mla_wgmma_shared_bytes = sizeof(Shared) + 1024;
