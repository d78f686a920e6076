// Sparse MLA decode for many heads (a CTA takes 64) on Hopper's warpgroup MMA (wgmma, sm_90a).
//
// Same contract as sparse_mla.sparse_mla_decode_reference: q [B, H, 576] bf16, a cache of
// 656-byte fp8_ds_mla rows (512 e4m3 latent, 4 fp32 group scales, 64 bf16 rope), top-k slots
// [B, K] (-1 = none) -> out [B, H, 512] bf16 and lse [B, H] fp32 (base e). A request's top-k list
// is cut into SPARSE_MLA_SPLITS slices, one CTA each (1, 2, 4 or 8: one thread-block cluster),
// which merge their outputs through distributed shared memory at the end (no second kernel, and
// no bf16 rounding of partial outputs).
//
// CTA = (slice of the top-k list, request, block of 64 heads), two warpgroups that take the
// slice's 32-token tiles in turn and hand each tile's softmax to the other (a seesaw): the
// output O [64 heads x 512] is too large for one warpgroup's registers, so warpgroup w owns the
// output columns of latent groups 2 w and 2 w + 1 (128 fp32 registers a thread) and adds every
// tile to them, while the scores and softmax of a tile are computed once, by its owner:
//   tile i's owner (i % 2): copies the rows of its next tile while it computes this one (latent
//     and scales by cp.async into its raw tile, a warp a row; the bf16 rope into registers,
//     stored into the bf16 tile with the conversion: there is no room to stage it in shared
//     memory), converts the e4m3 latent *unscaled* (exact) into wgmma's 128-byte-swizzled
//     K-major bf16 tile, computes
//     S = q k^T [64 heads x 32 tokens] over all 576 dims by wgmma from shared memory, each
//     latent group's partial scaled by its per-token scale in fp32 (scaled bf16 k would round
//     the scores and miss the reference lse), then the softmax against the running max the
//     previous tile's owner handed over, and hands over in turn the max and P s_g for the
//     other's two groups (bf16, in the A operand's register layout, through shared memory);
//   both: O_g += (P s_g) k8_g by wgmma, P s_g as the register A operand and the bf16 tile,
//     read MN-major, as B.
// So one warpgroup's softmax, conversion and copies run beside the other's MMAs. The running max
// moves only when a tile's exceeds it by 2^8, so O is rarely rescaled (P <= 256 in bf16 and
// fp32). Three bf16 tiles: the two in use and the one being converted; a tile's stage is free
// once all eight warps have passed the waits of their MMAs on it (an mbarrier).
// No headers: NVRTC compiles it at run time (longctx_kernels.cuda_module).

#ifndef SPARSE_MLA_SPLITS
#define SPARSE_MLA_SPLITS 1  // slices of a request's list: the cluster's CTAs
#endif
namespace {

constexpr int kTile = 32;               // tokens a tile: S's N
constexpr int kHeads = 64;              // heads a CTA: wgmma's M; heads past H are zero rows
constexpr int kRowBytes = 656;
constexpr int kRawRowBytes = 528;       // what a raw tile keeps of a row: the e4m3 latent and the 4 scales
constexpr int kBlocks = 9;              // 64-dim blocks of a q or k row: 8 latent, 1 rope
constexpr int kStages = 3;              // bf16 tiles: two in use, one being converted
constexpr int kThreads = 256;
constexpr int kGroupThreads = 128;
constexpr int kGroupBarrier = 1;        // named barriers: 1 + w, warpgroup w's own (its tile converted)
constexpr int kHandOverBarrier = 3;     // 3 + w, warpgroup w's tile handed over (w arrives, the other syncs)
constexpr int kSRegs = kTile / 2;
constexpr int kQBytes = kBlocks * kHeads * 128;
constexpr int kKBytes = kBlocks * kTile * 128;
constexpr float kSlack = 8.f;           // the running max moves only past 2^8: P <= 256
#define kInf __int_as_float(0x7f800000)
constexpr float kNoMax = -1e30f;        // a finite start: a tile with no row gives p = 0
constexpr int kSplits = SPARSE_MLA_SPLITS;
constexpr int kCols = 512 / kSplits;    // output columns a CTA of the cluster merges
static_assert(kSplits == 1 || kSplits == 2 || kSplits == 4 || kSplits == 8, "whole 64-column blocks a CTA, at most a portable cluster");

struct Shared {
  unsigned char q[kQBytes];             // 1024-B aligned, as the swizzle needs
  unsigned char k[kStages][kKBytes];
  unsigned char raw[2][kTile * kRawRowBytes];  // each warpgroup's next tile, latent and scales
  uint4 hand_p[4][kGroupThreads];       // P s_g of a tile for the other warpgroup's groups, by thread
  float2 hand_m[kGroupThreads];         // and the tile's running max of the thread's two rows
  float scale[kStages][4][kTile];
  int valid[kStages][kTile];
  float2 l_end[kGroupThreads];          // warpgroup 1's sums, at the end
  unsigned long long empty[kStages];    // mbarriers: every warp is done with the stage's tile
};
// The merge's inputs, where q and the bf16 tiles were: every CTA's unnormalized output for this
// CTA's columns, its max and its sum.
struct MergeIn {
  float o[kSplits][kHeads][kCols];
  float m[kSplits][kHeads];
  float l[kSplits][kHeads];
};
static_assert(sizeof(MergeIn) <= kQBytes + kStages * kKBytes, "the merge's inputs fit where q and the tiles were");

#include "barriers.cuh"

// Byte offset of 16-B chunk `chunk` (dims 8 chunk .. 8 chunk + 7) of row `row` in a tile of `rows`
// rows: 64-dim blocks of rows x 128 B, the chunk index XOR the row's low 3 bits (128-B swizzle).
__device__ __forceinline__ int swizzled(int rows, int row, int chunk) {
  return (chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// wgmma shared-memory descriptor, 128-B swizzle: start, leading and stride byte offsets.
__device__ __forceinline__ unsigned long long descriptor(unsigned addr, unsigned lead, unsigned stride) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (static_cast<unsigned long long>(lead >> 4) << 16) |
         (static_cast<unsigned long long>(stride >> 4) << 32) | (1ull << 62);
}

#include "wgmma.cuh"

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x, -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned bf16x2(float lo, float hi) {
  unsigned out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}
// Two e4m3 values (the low one first) -> bf16x2, exactly: through f16x2 and fp32.
__device__ __forceinline__ unsigned bf16x2_from_e4m3x2(unsigned v, int high) {
  unsigned h2;
  if (high) asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(h2) : "r"(v));
  else asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(h2) : "r"(v));
  float lo, hi;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n" : "=f"(lo), "=f"(hi) : "r"(h2));
  return bf16x2(lo, hi);
}
// 16 B global -> shared, asynchronously; src_bytes 0 zero-fills without reading.
__device__ __forceinline__ void copy_async(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 load_shared(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void store_shared(unsigned addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// D[64 x 32] (+)= A[64 x 16] . B[32 x 16]^T, both K-major in shared memory; accumulate = 0 overwrites D.
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], unsigned long long a, unsigned long long b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}
// D[64 x 128] += A[64 x 16] . B[16 x 128]: A from registers, B MN-major in shared memory.
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const unsigned (&a)[4], unsigned long long b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}


// 16 B global -> the raw tile, a warp a row at a time (512 contiguous bytes an instruction): warp w
// of the warpgroup copies rows 8 w .. 8 w + 7, lane l chunk l (lane 0 the scales too); the row's
// slot comes from the thread that converts it (thread 4 r holds row r's).
__device__ __forceinline__ void copy_raw(unsigned char* raw, const unsigned char* __restrict__ cache, int slot, int t) {
  const int warp = t >> 5, lane = t & 31;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = 8 * warp + j;
    const int s = __shfl_sync(0xffffffffu, slot, 4 * j);  // thread 4 r of this warp: row 8 warp + j
    const unsigned char* src = cache + static_cast<long long>(s < 0 ? 0 : s) * kRowBytes;
    copy_async(smem_addr(raw + r * kRawRowBytes + 16 * lane), src + 16 * lane, s < 0 ? 0 : 16);
    if (lane == 0) copy_async(smem_addr(raw + r * kRawRowBytes + 16 * 32), src + 16 * 32, s < 0 ? 0 : 16);
  }
}

// The row's 64 bf16 rope dims (8 chunks, this thread's two): read into registers a tile ahead,
// stored into the bf16 tile once its stage is free (there is no room to stage them in shared memory).
struct Rope {
  uint4 chunk[2];
};
__device__ __forceinline__ Rope load_rope(const unsigned char* __restrict__ cache, int slot, int part0) {
  Rope r;
  const uint4* src = reinterpret_cast<const uint4*>(cache + static_cast<long long>(slot < 0 ? 0 : slot) * kRowBytes + kRawRowBytes);
#pragma unroll
  for (int m = 0; m < 2; ++m) r.chunk[m] = slot < 0 ? make_uint4(0u, 0u, 0u, 0u) : __ldg(src + part0 + 4 * m);
  return r;
}
__device__ __forceinline__ void store_rope(unsigned k, const Rope& r, int row, int part0) {
#pragma unroll
  for (int m = 0; m < 2; ++m) store_shared(k + swizzled(kTile, row, 64 + part0 + 4 * m), r.chunk[m]);
}

// Chunks part0, part0 + 4, ... of row `row` of the warpgroup's raw tile -> bf16 tile `stage` (the latent
// unscaled, exact): four threads a row, so that a quarter-warp's stores land on distinct banks.
__device__ __forceinline__ void convert_raw(Shared& sh, int group, int stage, int slot, int row, int part0) {
  const unsigned k = smem_addr(sh.k[stage]);
  const unsigned raw = smem_addr(sh.raw[group] + row * kRawRowBytes);
  // Every load first: the stores' asm (a memory clobber) would otherwise keep each load behind
  // the previous chunk's stores, one shared-memory latency a chunk.
  uint4 v[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) v[m] = load_shared(raw + 16 * (part0 + 4 * m));  // latent dims 16 c .. + 15
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const int c = part0 + 4 * m;
    store_shared(k + swizzled(kTile, row, 2 * c), make_uint4(bf16x2_from_e4m3x2(v[m].x, 0), bf16x2_from_e4m3x2(v[m].x, 1),
                                                             bf16x2_from_e4m3x2(v[m].y, 0), bf16x2_from_e4m3x2(v[m].y, 1)));
    store_shared(k + swizzled(kTile, row, 2 * c + 1), make_uint4(bf16x2_from_e4m3x2(v[m].z, 0), bf16x2_from_e4m3x2(v[m].z, 1),
                                                                 bf16x2_from_e4m3x2(v[m].w, 0), bf16x2_from_e4m3x2(v[m].w, 1)));
  }
  if (part0 == 0) {
    const uint4 v = load_shared(raw + 16 * 32);
    sh.scale[stage][0][row] = __uint_as_float(v.x);
    sh.scale[stage][1][row] = __uint_as_float(v.y);
    sh.scale[stage][2][row] = __uint_as_float(v.z);
    sh.scale[stage][3][row] = __uint_as_float(v.w);
    sh.valid[stage][row] = slot >= 0;
  }
}

__device__ __forceinline__ void add_scaled(float (&s)[kSRegs], const float (&part)[kSRegs], const float* scale, int lane) {
#pragma unroll
  for (int j = 0; j < kTile / 8; ++j) {
    const float2 g = *reinterpret_cast<const float2*>(scale + 8 * j + 2 * (lane & 3));
    s[4 * j] += g.x * part[4 * j];
    s[4 * j + 1] += g.y * part[4 * j + 1];
    s[4 * j + 2] += g.x * part[4 * j + 2];
    s[4 * j + 3] += g.y * part[4 * j + 3];
  }
}

// A descriptor `bytes` further on: the start address is its low field, in 16-B units (shared
// memory stays below 2^18 B, so the sum never carries out of it). Cheaper than a new descriptor
// at each k-step, which took a dozen integer instructions a wgmma.
__device__ __forceinline__ unsigned long long advance(unsigned long long desc, unsigned bytes) {
  return (desc & 0xffffffff00000000ull) | (static_cast<unsigned>(desc) + (bytes >> 4));  // a 32-bit add
}

// d = q k^T over `steps` 16-dim k-steps from dim 16 first_step on (128-dim latent groups are 8
// steps, the 64 rope dims 4), by wgmma from shared memory (q and k: their K-major descriptors);
// one commit group.
__device__ __forceinline__ void scores(float (&d)[kSRegs], unsigned long long q, unsigned long long k, int first_step,
                                       int steps) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    if (ks < steps) {
      const int step = first_step + ks;  // 64-dim block step / 4, 32 B into the row a step
      wgmma_ss_n32(d, advance(q, (step >> 2) * kHeads * 128 + (step & 3) * 32),
                   advance(k, (step >> 2) * kTile * 128 + (step & 3) * 32), ks > 0);
    }
  }
  wgmma_commit();
}

// P s_g as the A operand of P.V (the accumulator layout is the A operand's register layout).
__device__ __forceinline__ void p_operand(unsigned (&a)[2][4], const float (&p)[kSRegs], const float* scale, int lane) {
#pragma unroll
  for (int c = 0; c < kTile / 16; ++c) {
    const float2 lo = *reinterpret_cast<const float2*>(scale + 16 * c + 2 * (lane & 3));
    const float2 hi = *reinterpret_cast<const float2*>(scale + 16 * c + 8 + 2 * (lane & 3));
    a[c][0] = bf16x2(p[8 * c] * lo.x, p[8 * c + 1] * lo.y);
    a[c][1] = bf16x2(p[8 * c + 2] * lo.x, p[8 * c + 3] * lo.y);
    a[c][2] = bf16x2(p[8 * c + 4] * hi.x, p[8 * c + 5] * hi.y);
    a[c][3] = bf16x2(p[8 * c + 6] * hi.x, p[8 * c + 7] * hi.y);
  }
}

// O_g += P_g k8_g over the tile in `k` (shared address), for this warpgroup's two latent groups
// (2 group, 2 group + 1): the tile read MN-major, 64-dim blocks kTile x 128 B apart (leading),
// 8-token groups 1024 B apart (stride).
__device__ __forceinline__ void pv(float (&o)[2][64], const unsigned (&a)[2][2][4], unsigned k, int group) {
  const unsigned long long b = descriptor(k + 2 * (2 * group) * kTile * 128, kTile * 128, 1024);
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int c = 0; c < kTile / 16; ++c) wgmma_rs_n128(o[g], a[g][c], advance(b, 2 * g * kTile * 128 + c * 16 * 128));
}

// O (and its reference max) to the reference `m`: only where it moved, rows of a warp at once.
__device__ __forceinline__ void rebase(float (&o)[2][64], float (&ref)[2], const float (&m)[2]) {
  if (__any_sync(0xffffffffu, ref[0] != m[0] || ref[1] != m[1])) {
    const float alpha[2] = {exp2_approx(ref[0] - m[0]), exp2_approx(ref[1] - m[1])};
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int e = 0; e < 64; ++e) o[g][e] *= alpha[(e >> 1) & 1];
    ref[0] = m[0];
    ref[1] = m[1];
  }
}

__device__ __forceinline__ void bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
// The tile the other warpgroup handed over: P s_g for this one's groups, and its running max
// (`handed` false: zeros, and the max unchanged).
__device__ __forceinline__ void take_over(const Shared& sh, int t, bool handed, unsigned (&a)[2][2][4], float (&m)[2]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint4 v = handed ? sh.hand_p[r][t] : make_uint4(0u, 0u, 0u, 0u);
    a[r >> 1][r & 1][0] = v.x;
    a[r >> 1][r & 1][1] = v.y;
    a[r >> 1][r & 1][2] = v.z;
    a[r >> 1][r & 1][3] = v.w;
  }
  if (handed) {
    const float2 mm = sh.hand_m[t];
    m[0] = mm.x;
    m[1] = mm.y;
  }
}

__device__ __forceinline__ void cluster_store2(unsigned addr, float a, float b) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

// A row's lse (base e) from its max (base 2, scaled) and its sum of exponentials: -inf for none.
__device__ __forceinline__ float lse_of(float m, float sum) {
  return sum > 0.f ? (m + log2_approx(sum)) * 0.6931471805599453f : -kInf;
}

// Tile j's stage is free once every warp is done with it: its owner's S and P.V, the other's P.V.
__device__ __forceinline__ void release(Shared& sh, int j, int lane) {
  if (j >= 0 && lane == 0) mbar_arrive(&sh.empty[j % kStages]);
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
  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kHeads;
  const int tid = threadIdx.x, lane = tid & 31, group = tid >> 7, other = group ^ 1, t = tid & 127;
  const int k_begin = split * k_per_split;
  const int k_end = min(K, k_begin + k_per_split);
  const int n_tiles = k_end > k_begin ? (k_end - k_begin + kTile - 1) / kTile : 0;
  const int* slots_of_b = topk + static_cast<long long>(b) * K;
  const int row = t >> 2, part0 = t & 3;  // this thread's row of its warpgroup's tiles, and first chunk
  auto slot_of = [&](int tile) {
    const int kk = k_begin + tile * kTile + row;
    return tile < n_tiles && kk < k_end ? slots_of_b[kk] : -1;
  };

  // Launched as a programmatic dependent: the next kernel on the stream may take its places from
  // now on, and this one touches global memory only once the previous kernel is done.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) mbar_init(&sh.empty[s], kThreads / 32);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  for (int i = tid; i < kHeads * 72; i += kThreads) {
    const int r = i / 72, chunk = i % 72;
    const bool ok = head0 + r < H;
    copy_async(smem_addr(sh.q) + swizzled(kHeads, r, chunk),
               q + (static_cast<long long>(b) * H + (ok ? head0 + r : 0)) * 576 + 8 * chunk, ok ? 16 : 0);
  }
  int slot = slot_of(group);
  copy_raw(sh.raw[group], cache, slot, t);
  copy_commit();
  int slot_next = slot_of(group + 2);
  copy_wait<0>();
  bar_sync(kGroupBarrier + group, kGroupThreads);
  if (group < n_tiles) {
    convert_raw(sh, group, group, slot, row, part0);
    store_rope(smem_addr(sh.k[group]), load_rope(cache, slot, part0), row, part0);
  }
  fence_async_shared();
  __syncthreads();  // q, the mbarriers

  const int row0 = (t >> 5) * 16 + (lane >> 2);  // this thread's heads: row0 and row0 + 8
  const unsigned long long qd = descriptor(smem_addr(sh.q), 16, 1024);
  float o[2][64];
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[g][i] = 0.f;
  float o_ref[2] = {kNoMax, kNoMax};  // the max O's terms are relative to
  float m[2] = {kNoMax, kNoMax};      // the running max of the last tile seen (own or handed over)
  float l[2] = {0.f, 0.f}, l_ref[2] = {kNoMax, kNoMax};  // this warpgroup's tiles' sum, and its reference

  for (int i = group; i < n_tiles; i += 2) {
    const int stage = i % kStages;
    const int slot_after = slot_of(i + 4);  // read now, used once tile i + 2 is converted
    const Rope rope_next = load_rope(cache, slot_next, part0);  // tile i + 2's, landing during this tile
    // Tile i converted and its rope stored, by every thread of the warpgroup.
    fence_async_shared();
    bar_sync(kGroupBarrier + group, kGroupThreads);
    copy_raw(sh.raw[group], cache, slot_next, t);  // tile i + 2's rows: the raw tile is free
    copy_commit();
    const unsigned ka = smem_addr(sh.k[stage]);
    const unsigned long long kd = descriptor(ka, 16, 1024);
    float s[kSRegs], pa[kSRegs], pb[kSRegs];
    // This warpgroup's P.V of tile i - 2, issued before the conversion: nothing stays in flight
    // into the waits below (ptxas serializes the MMAs if an accumulator's wgmma might be).
    wgmma_wait<0>();
    release(sh, i - 2, lane);
    pin(o[0]);
    pin(o[1]);
    wgmma_fence();
    scores(s, qd, kd, 32, 4);  // the rope: unscaled
    scores(pa, qd, kd, 0, 8);
    scores(pb, qd, kd, 8, 8);
    // S whole before the hand-over: only the softmax and P.V wait for the other warpgroup.
    wgmma_wait<1>();  // the rope, group 0
    pin(s);
    pin(pa);
    add_scaled(s, pa, sh.scale[stage][0], lane);
    wgmma_fence();
    scores(pa, qd, kd, 16, 8);
    wgmma_wait<1>();
    pin(pb);
    add_scaled(s, pb, sh.scale[stage][1], lane);
    wgmma_fence();
    scores(pb, qd, kd, 24, 8);
    wgmma_wait<1>();
    pin(pa);
    add_scaled(s, pa, sh.scale[stage][2], lane);
    wgmma_wait<0>();
    pin(pb);
    add_scaled(s, pb, sh.scale[stage][3], lane);
    pin(o[0]);
    pin(o[1]);
    // Tile i - 1's P from the other warpgroup; O to its reference, then its P.V (the first
    // tile has none: zeros times tile i's rows, so that every warp runs the same MMAs).
    unsigned po[2][2][4];
    if (i > 0) bar_sync(kHandOverBarrier + other, kThreads);
    take_over(sh, t, i > 0, po, m);
    rebase(o, o_ref, m);
    wgmma_fence();
    pv(o, po, smem_addr(sh.k[i > 0 ? (i - 1) % kStages : stage]), group);
    wgmma_commit();

    // Online softmax over the tile, base 2; the running max moves only past kSlack.
    float tile_max[2] = {-kInf, -kInf};
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j) {
      const int col = 8 * j + 2 * (lane & 3);
      const int ok0 = sh.valid[stage][col], ok1 = sh.valid[stage][col + 1];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s[4 * j + 2 * r] = ok0 ? s[4 * j + 2 * r] * scale_log2 : -kInf;
        s[4 * j + 2 * r + 1] = ok1 ? s[4 * j + 2 * r + 1] * scale_log2 : -kInf;
        tile_max[r] = fmaxf(tile_max[r], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      }
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      if (tile_max[r] > m[r] + kSlack) m[r] = tile_max[r];
    }
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * j + e] = exp2_approx(s[4 * j + e] - m[e >> 1]);
        sum[e >> 1] += s[4 * j + e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (l_ref[r] != m[r]) {
        l[r] *= exp2_approx(l_ref[r] - m[r]);
        l_ref[r] = m[r];
      }
      l[r] += sum[r];
    }
    // The other warpgroup's P s_g and the max, handed over; then this one's.
    unsigned a[2][2][4];
#pragma unroll
    for (int g = 0; g < 2; ++g) p_operand(a[g], s, sh.scale[stage][2 * other + g], lane);
#pragma unroll
    for (int r = 0; r < 4; ++r) sh.hand_p[r][t] = make_uint4(a[r >> 1][r & 1][0], a[r >> 1][r & 1][1], a[r >> 1][r & 1][2], a[r >> 1][r & 1][3]);
    sh.hand_m[t] = make_float2(m[0], m[1]);
    bar_arrive(kHandOverBarrier + group, kThreads);
#pragma unroll
    for (int g = 0; g < 2; ++g) p_operand(a[g], s, sh.scale[stage][2 * group + g], lane);
    wgmma_wait<0>();  // the P.V of tile i - 1
    if (i > 0) release(sh, i - 1, lane);
    pin(o[0]);
    pin(o[1]);
    rebase(o, o_ref, m);
    wgmma_fence();
    pv(o, a, ka, group);
    wgmma_commit();

    // Tile i + 2 (this warpgroup's next): its raw rows landed, its stage free (tile i - 1 done).
    const int next = i + 2;
    copy_wait<0>();
    bar_sync(kGroupBarrier + group, kGroupThreads);  // every thread's copies of the raw tile landed
    if (next < n_tiles) {
      if (next >= kStages) mbar_wait(&sh.empty[next % kStages], ((next / kStages) + 1) & 1);
      convert_raw(sh, group, next % kStages, slot_next, row, part0);
      store_rope(smem_addr(sh.k[next % kStages]), rope_next, row, part0);
    }
    slot_next = slot_after;
  }
  // The other warpgroup's last tile, if it had the last.
  if (n_tiles > 0 && ((n_tiles - 1) & 1) == other) {
    unsigned po[2][2][4];
    bar_sync(kHandOverBarrier + other, kThreads);
    take_over(sh, t, true, po, m);
    wgmma_wait<0>();
    pin(o[0]);
    pin(o[1]);
    rebase(o, o_ref, m);
    wgmma_fence();
    pv(o, po, smem_addr(sh.k[(n_tiles - 1) % kStages]), group);
    wgmma_commit();
  }
  wgmma_wait<0>();
  pin(o[0]);
  pin(o[1]);
  copy_wait<0>();  // no copy may land after the CTA has gone

  // Both warpgroups' sums at the last tile's max (m, which O is at now), over the quad's columns.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = l_ref[r] == m[r] ? l[r] : l[r] * exp2_approx(l_ref[r] - m[r]);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  // (Warpgroup 0's go where the hand-over's max was, once warpgroup 1 has taken the last one.)
  if (group == 1) sh.l_end[t] = make_float2(l[0], l[1]);
  __syncthreads();
  if (group == 0) sh.hand_m[t] = make_float2(l[0], l[1]);
  __syncthreads();
  const float2 theirs = group == 0 ? sh.l_end[t] : sh.hand_m[t];
  l[0] += theirs.x;
  l[1] += theirs.y;
#if SPARSE_MLA_SPLITS == 1
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = head0 + row0 + 8 * r;
    if (h >= H) continue;
    const long long at = static_cast<long long>(b) * H + h;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = 128 * (2 * group + g) + 8 * j + 2 * (lane & 3);
        out[(at * 512 + col) / 2] = bf16x2(o[g][4 * j + 2 * r] * inv, o[g][4 * j + 2 * r + 1] * inv);
      }
    if (group == 0 && (lane & 3) == 0)
      out_lse[at] = lse_of(m[r], l[r]);
  }
#else
  // The slices' merge, through distributed shared memory: CTA c of the cluster gets every CTA's
  // output for columns c kCols .. + kCols - 1 (unnormalized, at that CTA's max) and max and sum.
  cluster_sync();  // every CTA is done with its shared memory
  MergeIn& in = *reinterpret_cast<MergeIn*>(&sh);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = row0 + 8 * r;
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = 128 * (2 * group + g) + 8 * j + 2 * (lane & 3);
        cluster_store2(cluster_addr(&in.o[split][h][col % kCols], col / kCols), o[g][4 * j + 2 * r], o[g][4 * j + 2 * r + 1]);
      }
    if (group == 0 && (lane & 3) == 0)
      for (int c = 0; c < kSplits; ++c) {
        cluster_store(cluster_addr(&in.m[split][h], c), m[r]);
        cluster_store(cluster_addr(&in.l[split][h], c), l[r]);
      }
  }
  cluster_sync();  // every part is in
  for (int e = tid; e < kHeads * kCols / 2; e += kThreads) {
    const int h = e / (kCols / 2), c = 2 * (e % (kCols / 2));
    if (head0 + h >= H) continue;
    float top = kNoMax;
#pragma unroll
    for (int p = 0; p < kSplits; ++p) top = fmaxf(top, in.m[p][h]);
    float sum = 0.f, o0 = 0.f, o1 = 0.f;
#pragma unroll
    for (int p = 0; p < kSplits; ++p) {
      const float w = exp2_approx(in.m[p][h] - top);
      sum += w * in.l[p][h];
      o0 += w * in.o[p][h][c];
      o1 += w * in.o[p][h][c + 1];
    }
    const long long at = static_cast<long long>(b) * H + head0 + h;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    out[(at * 512 + split * kCols + c) / 2] = bf16x2(o0 * inv, o1 * inv);
    if (split == 0 && c == 0) out_lse[at] = lse_of(top, sum);
  }
#endif
}

extern "C" __device__ const int sparse_mla_wgmma_shared_bytes = sizeof(Shared) + 1024;  // + the alignment slack
