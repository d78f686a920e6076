// Sparse MLA decode for many heads (a CTA takes 64) on Hopper's warpgroup MMA (wgmma, sm_90a).
//
// Same contract as sparse_mla.sparse_mla_decode_reference: q [B, H, 576] bf16, a cache of
// 656-byte fp8_ds_mla rows (512 e4m3 latent, 4 fp32 group scales, 64 bf16 rope), top-k slots
// [B, K] (-1 = none) -> out [B, H, 512] bf16 and lse [B, H] fp32 (base e). With several slices of
// the top-k list, each slice writes a partial [slice, B, H, 512] and lse for lse_merge.
//
// CTA = (slice of the top-k list, request, block of 64 heads), two warpgroups of 128 threads that
// share every step (a third, producer warpgroup for the copies and the conversion, setmaxnreg
// 88/208, was correct but 19% slower; docs/benchmarks.md):
//   rows: each thread copies its 16-B chunks of the tile three tiles ahead by cp.async into a raw
//     ring (a missing row is zero-filled, read from nowhere), and, while the tile's S products
//     run, converts its chunks of the next tile into a bf16 tile in wgmma's 128-byte-swizzled
//     K-major layout, 576 dims a token: the e4m3 latent *unscaled* (exact), the rope as is, the
//     four group scales and a valid flag beside it. The same thread copies and converts a chunk,
//     so its own cp.async wait is the only one needed;
//   S = q k^T [64 heads x 32 tokens] by wgmma from shared memory (q staged once): warpgroup w
//     takes latent groups 2 w and 2 w + 1 and half of the rope, one fp32 accumulator a group,
//     scaled by that group's per-token scale in fp32 (scaled bf16 k would round the scores and
//     miss the reference lse); the halves meet in shared memory and both warpgroups add them in
//     the same order, so they hold the same S;
//   the online softmax in registers; then O over the warpgroup's two latent groups (256 output
//     columns, 128 fp32 registers a thread) += (P s_g) k8_g, P s_g as the register A operand and
//     the same bf16 tile, read MN-major, as B.
// No headers: NVRTC compiles it at run time (longctx_kernels.cuda_module).

namespace {

constexpr int kTile = 32;               // tokens a tile: S's N
constexpr int kHeads = 64;              // heads a CTA: wgmma's M; heads past H are zero rows
constexpr int kRowBytes = 656;
constexpr int kBlocks = 9;              // 64-dim blocks of a q or k row: 8 latent, 1 rope
constexpr int kStages = 2;             // bf16 tiles: the one in use, the one being converted
constexpr int kRawStages = 3;          // raw tiles in flight
constexpr int kThreads = 256;
constexpr int kChunks = kTile * kRowBytes / 16;               // 16-B chunks of a raw tile
constexpr int kChunksPerThread = (kChunks + kThreads - 1) / kThreads;
constexpr int kSRegs = kTile / 2;       // S accumulator registers a thread: 64 x kTile / 128
constexpr int kQBytes = kBlocks * kHeads * 128;
constexpr int kKBytes = kBlocks * kTile * 128;
#define kInf __int_as_float(0x7f800000)

struct Shared {
  unsigned char q[kQBytes];             // 1024-B aligned, as the swizzle needs
  unsigned char k[kStages][kKBytes];
  unsigned char raw[kRawStages][kTile * kRowBytes];
  float scale[kStages][4][kTile];
  int valid[kStages][kTile];
  int raw_valid[kRawStages][kTile];
  float half_scores[2][kSRegs][128];  // each warpgroup's half of S, in its accumulator layout
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

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

// Thread t's chunks of a tile: t, t + 256, ... of the tile's 32 x 41 chunks (row = chunk / 41):
// a warp's 32 consecutive chunks are 512 contiguous bytes of one or two rows.
__device__ __forceinline__ void tile_slots(int (&slots)[kChunksPerThread], const int* __restrict__ topk, int first,
                                           int k_end, int tid) {
#pragma unroll
  for (int n = 0; n < kChunksPerThread; ++n) {
    const int chunk = tid + n * kThreads, kk = first + chunk / 41;
    slots[n] = chunk < kChunks && kk < k_end ? topk[kk] : -1;
  }
}

__device__ __forceinline__ void copy_tile(Shared& sh, const unsigned char* __restrict__ cache,
                                          const int (&slots)[kChunksPerThread], int stage, int tid) {
#pragma unroll
  for (int n = 0; n < kChunksPerThread; ++n) {
    const int chunk = tid + n * kThreads;
    if (chunk < kChunks) {
      const int row = chunk / 41, part = chunk % 41;
      const int slot = slots[n];
      const unsigned char* src = cache + static_cast<long long>(slot < 0 ? 0 : slot) * kRowBytes + 16 * part;
      copy_async(smem_addr(sh.raw[stage] + chunk * 16), src, slot < 0 ? 0 : 16);
      if (part == 32) sh.raw_valid[stage][row] = slot >= 0;
    }
  }
  copy_commit();  // every thread commits a group a tile, empty or not: the waits count groups
}

// This thread's chunks of raw tile `raw` -> bf16 tile `stage`.
__device__ __forceinline__ void convert_tile(Shared& sh, int raw, int stage, int tid) {
  const unsigned k = smem_addr(sh.k[stage]);
#pragma unroll
  for (int n = 0; n < kChunksPerThread; ++n) {
    const int chunk = tid + n * kThreads;
    if (chunk < kChunks) {
      const int row = chunk / 41, part = chunk % 41;
      const uint4 v = load_shared(smem_addr(sh.raw[raw] + chunk * 16));
      if (part < 32) {  // latent dims 16 part .. + 15
        store_shared(k + swizzled(kTile, row, 2 * part), make_uint4(bf16x2_from_e4m3x2(v.x, 0), bf16x2_from_e4m3x2(v.x, 1),
                                                                    bf16x2_from_e4m3x2(v.y, 0), bf16x2_from_e4m3x2(v.y, 1)));
        store_shared(k + swizzled(kTile, row, 2 * part + 1), make_uint4(bf16x2_from_e4m3x2(v.z, 0), bf16x2_from_e4m3x2(v.z, 1),
                                                                        bf16x2_from_e4m3x2(v.w, 0), bf16x2_from_e4m3x2(v.w, 1)));
      } else if (part == 32) {  // the four group scales
        sh.scale[stage][0][row] = __uint_as_float(v.x);
        sh.scale[stage][1][row] = __uint_as_float(v.y);
        sh.scale[stage][2][row] = __uint_as_float(v.z);
        sh.scale[stage][3][row] = __uint_as_float(v.w);
        sh.valid[stage][row] = sh.raw_valid[raw][row];
      } else {  // rope dims 512 + 8 (part - 33) .. + 7
        store_shared(k + swizzled(kTile, row, 64 + part - 33), v);
      }
    }
  }
  fence_async_shared();  // the tile is read next by wgmma (the async proxy)
}

// S's accumulator layout (m64nNk16, fp32): thread t of the warpgroup holds rows 16 (t / 32) + (t % 32) / 4
// (registers 4 j, 4 j + 1) and that + 8 (4 j + 2, 4 j + 3), columns 8 j + 2 (t % 4) and + 1.
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

// d = q k^T over `steps` 16-dim k-steps from dim 16 first_step on (128-dim latent groups are 8
// steps, the 64 rope dims 4), by wgmma from shared memory; one commit group.
__device__ __forceinline__ void scores(float (&d)[kSRegs], unsigned q, unsigned k, int first_step, int steps) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    if (ks < steps) {
      const int step = first_step + ks;  // 64-dim block step / 4, 32 B into the row per step
      const unsigned long long a = descriptor(q + (step >> 2) * kHeads * 128 + (step & 3) * 32, 16, 1024);
      const unsigned long long b = descriptor(k + (step >> 2) * kTile * 128 + (step & 3) * 32, 16, 1024);
      wgmma_ss_n32(d, a, b, ks > 0);
    }
  }
  wgmma_commit();
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
sparse_mla_wgmma(const unsigned short* __restrict__ q, const unsigned char* __restrict__ cache, const int* __restrict__ topk,
                 unsigned* __restrict__ out, float* __restrict__ out_lse, int B, int H, int K, int k_per_split,
                 float scale_log2) {
  extern __shared__ unsigned char smem_raw[];
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kHeads;
  const int tid = threadIdx.x, lane = tid & 31;
  const int k_begin = split * k_per_split;
  const int k_end = min(K, k_begin + k_per_split);
  const int n_tiles = k_end > k_begin ? (k_end - k_begin + kTile - 1) / kTile : 0;
  const int* slots_of_b = topk + static_cast<long long>(b) * K;

  // q's 64 heads into shared memory, swizzled (heads past H are zeros), and the first raw tiles
  // in flight; then the first tile converted.
  for (int i = tid; i < kHeads * 72; i += kThreads) {  // by cp.async: plain loads would wait one by one
    const int row = i / 72, chunk = i % 72;
    const bool ok = head0 + row < H;
    copy_async(smem_addr(sh.q) + swizzled(kHeads, row, chunk),
               q + (static_cast<long long>(b) * H + (ok ? head0 + row : 0)) * 576 + 8 * chunk, ok ? 16 : 0);
  }
  int slots[kChunksPerThread];
#pragma unroll
  for (int t = 0; t < kRawStages; ++t) {
    tile_slots(slots, slots_of_b, k_begin + t * kTile, t < n_tiles ? k_end : 0, tid);
    copy_tile(sh, cache, slots, t, tid);
  }
  tile_slots(slots, slots_of_b, k_begin + kRawStages * kTile, kRawStages < n_tiles ? k_end : 0, tid);
  copy_wait<kRawStages - 1>();
  convert_tile(sh, 0, 0, tid);
  __syncthreads();

  const int wg = tid >> 7;  // warpgroup 0 or 1: latent groups 2 wg and 2 wg + 1 of the output
  const int row0 = ((tid & 127) >> 5) * 16 + (lane >> 2);  // this thread's heads: row0 and row0 + 8
  const unsigned qa = smem_addr(sh.q);
  float o[2][64];
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[g][i] = 0.f;
  float m[2] = {-1e30f, -1e30f}, l[2] = {0.f, 0.f};  // a finite start: a tile with no row gives p = 0

  for (int i = 0; i < n_tiles; ++i) {
    const int stage = i & 1;
    // Raw tile i + 3 into the raw stage that tile i left (converted last step).
    copy_tile(sh, cache, slots, i % kRawStages, tid);
    tile_slots(slots, slots_of_b, k_begin + (i + kRawStages + 1) * kTile, i + kRawStages + 1 < n_tiles ? k_end : 0, tid);

    const unsigned ka = smem_addr(sh.k[stage]);
    // S: warpgroup w takes latent groups 2 w and 2 w + 1 and half of the rope, the same
    // instructions on other addresses; the two halves meet in shared memory, and both
    // warpgroups add them in the same order.
    float s[kSRegs], part_a[kSRegs], part_b[kSRegs];
    wgmma_fence();
    scores(s, qa, ka, 32 + 2 * wg, 2);  // the rope: unscaled
    scores(part_a, qa, ka, 16 * wg, 8);
    scores(part_b, qa, ka, 16 * wg + 8, 8);
    // While they run: tile i + 1, landed (this thread's copies), into the other bf16 stage.
    copy_wait<kRawStages - 1>();
    if (i + 1 < n_tiles) convert_tile(sh, (i + 1) % kRawStages, stage ^ 1, tid);
    wgmma_wait<1>();
    pin(s);
    pin(part_a);
    add_scaled(s, part_a, sh.scale[stage][2 * wg], lane);
    wgmma_wait<0>();
    pin(part_b);
    add_scaled(s, part_b, sh.scale[stage][2 * wg + 1], lane);
#pragma unroll
    for (int e = 0; e < kSRegs; ++e) sh.half_scores[wg][e][tid & 127] = s[e];
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
#pragma unroll
    for (int e = 0; e < kSRegs; ++e) s[e] = wg == 0 ? s[e] + sh.half_scores[1][e][tid & 127]
                                                    : sh.half_scores[0][e][tid & 127] + s[e];

    // Online softmax over the tile, in base 2.
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
    float alpha[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      alpha[r] = exp2_approx(m[r] - m_new);
      m[r] = m_new;
    }
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * j + e] = exp2_approx(s[4 * j + e] - m[e >> 1]);
        sum[e >> 1] += s[4 * j + e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int e = 0; e < 64; ++e) o[g][e] *= alpha[(e >> 1) & 1];

    // O_g += (P s_g) k8_g: P's accumulator layout is the A operand's register layout.
    unsigned a[2][kTile / 16][4];
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const float* scale = sh.scale[stage][2 * wg + g];
#pragma unroll
      for (int c = 0; c < kTile / 16; ++c) {
        const float2 lo = *reinterpret_cast<const float2*>(scale + 16 * c + 2 * (lane & 3));
        const float2 hi = *reinterpret_cast<const float2*>(scale + 16 * c + 8 + 2 * (lane & 3));
        a[g][c][0] = bf16x2(s[8 * c] * lo.x, s[8 * c + 1] * lo.y);
        a[g][c][1] = bf16x2(s[8 * c + 2] * lo.x, s[8 * c + 3] * lo.y);
        a[g][c][2] = bf16x2(s[8 * c + 4] * hi.x, s[8 * c + 5] * hi.y);
        a[g][c][3] = bf16x2(s[8 * c + 6] * hi.x, s[8 * c + 7] * hi.y);
      }
    }
    pin(o[0]);
    pin(o[1]);
    wgmma_fence();
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int c = 0; c < kTile / 16; ++c) {
        // B = the tile's dims 128 (2 wg + g) .. + 127, tokens 16 c .. 16 c + 15, read MN-major:
        // 64-dim blocks kTile x 128 B apart (leading), 8-token groups 1024 B apart (stride).
        const unsigned addr = ka + (2 * (2 * wg + g)) * kTile * 128 + c * 16 * 128;
        wgmma_rs_n128(o[g], a[g][c], descriptor(addr, kTile * 128, 1024));
      }
    wgmma_commit();
    wgmma_wait<0>();
    pin(o[0]);
    pin(o[1]);
    __syncthreads();  // tile i is consumed by both warpgroups, tile i + 1 converted by every thread
  }
  copy_wait<0>();  // no copy may land after the CTA has gone

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = head0 + row0 + 8 * r;
    if (h >= H) continue;
    const long long at = (static_cast<long long>(split) * B + b) * H + h;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = 128 * (2 * wg + g) + 8 * j + 2 * (lane & 3);
        out[(at * 512 + col) / 2] = bf16x2(o[g][4 * j + 2 * r] * inv, o[g][4 * j + 2 * r + 1] * inv);
      }
    if (wg == 0 && (lane & 3) == 0)
      out_lse[at] = l[r] > 0.f ? (m[r] + log2_approx(l[r])) * 0.6931471805599453f : -kInf;
  }
}

extern "C" __device__ const int sparse_mla_wgmma_shared_bytes = sizeof(Shared) + 1024;  // + the alignment slack
