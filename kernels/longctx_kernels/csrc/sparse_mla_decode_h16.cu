// Sparse MLA decode for up to 16 heads, written against the mma.sync fragment layouts.
//
// Same contract as sparse_mla.sparse_mla_decode_reference: q [B, H, 576] bf16, a cache of
// 656-byte fp8_ds_mla rows (512 e4m3 latent, 4 fp32 group scales, 64 bf16 rope), top-k slots
// [B, K] (-1 = none) -> out [S, B, H, 512] bf16 and lse [S, B, H] fp32 (base e) per top-k slice.
//
// Why by hand: the Triton kernel spends 110-164 warp-instructions per 656-B row on layout
// changes around 8.5 MMAs (docs/benchmarks.md). Here each row is converted once (e4m3 -> fp16
// is exact, one cvt per pair) into a shared tile that both products read with ldmatrix:
//   S = q K^T per 128-wide group, scaled by the group's per-token scale in fp32;
//   O += (P * s_g / s_ref) V8, each warp owning 512 / warps output columns of one group g,
//   s_ref the tile's largest s_g so that the fp16 operand stays in [0, 1].
// CTA = SPARSE_MLA_WARPS warps (4 or 8) = one (top-k slice, request); tiles of 64 rows. The next
// tile's rows are loaded into registers while the current one is computed, and the slots two
// tiles ahead into shared memory, so each tile costs one round trip to HBM, hidden.

// No headers: NVRTC compiles it at run time (longctx_kernels.cuda_module), halves are
// unsigned short in memory and converted with PTX.

namespace {

#ifndef SPARSE_MLA_WARPS
#define SPARSE_MLA_WARPS 4
#endif
#ifndef SPARSE_MLA_TILE
#define SPARSE_MLA_TILE 64
#endif
#ifndef SPARSE_MLA_CTAS_PER_SM
#define SPARSE_MLA_CTAS_PER_SM 2
#endif
constexpr int kWarps = SPARSE_MLA_WARPS;  // 4 or 8 (the loader's -D)
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = SPARSE_MLA_TILE;    // rows per tile: 32 or 64
constexpr int kRowsPerWarp = kTile / kWarps;   // S rows (tokens) of one warp: 16 or 8
constexpr int kNTiles = kRowsPerWarp / 8;      // their n8 tiles: 2 or 1
constexpr int kColsPerWarp = 512 / kWarps;     // output columns of one warp: 128 or 64
constexpr int kOTiles = kColsPerWarp / 8;
constexpr int kHeads = 16;         // MMA M; H <= 16, padded
constexpr int kRowBytes = 656;
constexpr int kStride = 576 + 8;   // halves per shared row: 1168 B, rows 4 banks apart for ldmatrix
constexpr int kPStride = kTile + 4;
#define kInf __int_as_float(0x7f800000)

struct Shared {
  unsigned short q[kHeads * kStride];  // fp16
  unsigned short kv[kTile * kStride];  // fp16
  float p[kHeads * kPStride];
  float scale[4 * kTile];
  float valid[kTile];
  int slots[3][kTile];  // top-k slots of tiles i, i+1 (being loaded) and i+2 (arriving)
  float red_max[kWarps * kHeads];
  float red_sum[kWarps * kHeads];
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// d (+)= a * b, m16n8k16, fp16 operands, fp32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short pair) {
  unsigned out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(pair));
  return out;
}

__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
  unsigned out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

__device__ __forceinline__ unsigned bf16x2_to_f16x2(unsigned v) {
  return pack_f16x2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// The registers one thread holds for a tile: its 16-B latent and rope chunks, the scales and
// valid flags of its rows. Chunk c of a row is read by thread c of a warp: 512 B per warp load.
constexpr int kLatentPerThread = kTile * 32 / kThreads;
constexpr int kRopePerThread = kTile * 8 / kThreads;
constexpr int kScalesPerThread = (kTile * 4 + kThreads - 1) / kThreads;
struct TileRegs {
  uint4 latent[kLatentPerThread];
  uint4 rope[kRopePerThread];
  float scale[kScalesPerThread];
  float valid;
};

// Loads are unconditional (a missing row reads row 0) and masked afterwards: straight-line code
// that issues every load of the tile before the first one returns.
__device__ __forceinline__ const unsigned char* row_ptr(const unsigned char* cache, int slot) {
  return cache + (long long)max(slot, 0) * kRowBytes;
}

__device__ __forceinline__ void load_tile(TileRegs& r, const unsigned char* __restrict__ cache,
                                          const int* tile_slots, int tid) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
  #pragma unroll
  for (int i = 0; i < kLatentPerThread; ++i) {
    const int slot = tile_slots[(tid >> 5) + kWarps * i];
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row_ptr(cache, slot)) + (tid & 31));
    r.latent[i] = slot >= 0 ? v : zero;
  }
  #pragma unroll
  for (int i = 0; i < kRopePerThread; ++i) {
    const int slot = tile_slots[(tid >> 3) + (kThreads / 8) * i];
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row_ptr(cache, slot) + 528) + (tid & 7));
    r.rope[i] = slot >= 0 ? v : zero;
  }
  #pragma unroll
  for (int i = 0; i < kScalesPerThread; ++i) {
    const int e = min(tid + kThreads * i, kTile * 4 - 1);  // (row, group) = (e / 4, e % 4)
    const int slot = tile_slots[e >> 2];
    const float v = __ldg(reinterpret_cast<const float*>(row_ptr(cache, slot) + 512) + (e & 3));
    r.scale[i] = slot >= 0 ? v : 0.f;
  }
  r.valid = tile_slots[min(tid, kTile - 1)] >= 0 ? 1.f : 0.f;
}

// Slots of the tile at k0 into shared memory (one load per row, two tiles ahead of their use).
__device__ __forceinline__ void load_slots(int* dst, const int* __restrict__ slots, int k0, int k_end, int tid) {
  if (tid < kTile) dst[tid] = k0 + tid < k_end ? __ldg(slots + k0 + tid) : -1;
}

__device__ __forceinline__ void store_tile(Shared& sh, const TileRegs& r, int tid) {
  #pragma unroll
  for (int i = 0; i < kLatentPerThread; ++i) {
    const int row = (tid >> 5) + kWarps * i;
    const unsigned w[4] = {r.latent[i].x, r.latent[i].y, r.latent[i].z, r.latent[i].w};
    uint4 lo, hi;
    lo.x = e4m3x2_to_f16x2(w[0] & 0xffff); lo.y = e4m3x2_to_f16x2(w[0] >> 16);
    lo.z = e4m3x2_to_f16x2(w[1] & 0xffff); lo.w = e4m3x2_to_f16x2(w[1] >> 16);
    hi.x = e4m3x2_to_f16x2(w[2] & 0xffff); hi.y = e4m3x2_to_f16x2(w[2] >> 16);
    hi.z = e4m3x2_to_f16x2(w[3] & 0xffff); hi.w = e4m3x2_to_f16x2(w[3] >> 16);
    uint4* dst = reinterpret_cast<uint4*>(sh.kv + row * kStride + (tid & 31) * 16);
    dst[0] = lo;
    dst[1] = hi;
  }
  #pragma unroll
  for (int i = 0; i < kRopePerThread; ++i) {
    const int row = (tid >> 3) + (kThreads / 8) * i;
    uint4 h;
    h.x = bf16x2_to_f16x2(r.rope[i].x); h.y = bf16x2_to_f16x2(r.rope[i].y);
    h.z = bf16x2_to_f16x2(r.rope[i].z); h.w = bf16x2_to_f16x2(r.rope[i].w);
    *reinterpret_cast<uint4*>(sh.kv + row * kStride + 512 + (tid & 7) * 8) = h;
  }
  #pragma unroll
  for (int i = 0; i < kScalesPerThread; ++i) {
    const int e = tid + kThreads * i;
    if (e < kTile * 4) sh.scale[(e & 3) * kTile + (e >> 2)] = r.scale[i];
  }
  if (tid < kTile) sh.valid[tid] = r.valid;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, SPARSE_MLA_CTAS_PER_SM)
sparse_mla_decode_h16(const unsigned short* __restrict__ q, const unsigned char* __restrict__ cache,
                      const int* __restrict__ topk, unsigned short* __restrict__ out, float* __restrict__ out_lse,
                      int B, int H, int K, int k_per_split, float qk_scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Shared& sh = *reinterpret_cast<Shared*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x, b = blockIdx.y;
  const int k_begin = split * k_per_split;
  const int k_end = min(k_begin + k_per_split, K);
  const int* slots = topk + (long long)b * K;

  // q -> fp16 shared rows (heads >= H are zero).
  for (int i = tid; i < kHeads * 72; i += kThreads) {  // 72 chunks of 8 values per head
    const int h = i / 72, c = i % 72;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < H) {
      const uint4 raw = *reinterpret_cast<const uint4*>(q + ((long long)b * H + h) * 576 + c * 8);
      v.x = bf16x2_to_f16x2(raw.x); v.y = bf16x2_to_f16x2(raw.y);
      v.z = bf16x2_to_f16x2(raw.z); v.w = bf16x2_to_f16x2(raw.w);
    }
    *reinterpret_cast<uint4*>(sh.q + h * kStride + c * 8) = v;
  }

  // Fragment coordinates (PTX ISA, mma.m16n8k16): rows lane/4 and lane/4 + 8, columns 2*(lane%4) + {0, 1}.
  const int frag_row = lane >> 2, frag_col = 2 * (lane & 3);
  float o[kOTiles][4];  // warp `warp` owns output columns [kColsPerWarp warp, + kColsPerWarp)
  #pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  const int group = warp * kColsPerWarp / 128;  // the latent group of those columns
  float m_run[2] = {-1e30f, -1e30f}, l_run[2] = {0.f, 0.f};
  float o_unit = 1.f;  // o holds output / o_unit (see s_ref)

  load_slots(sh.slots[0], slots, k_begin, k_end, tid);
  load_slots(sh.slots[1], slots, k_begin + kTile, k_end, tid);
  __syncthreads();
  TileRegs regs;
  load_tile(regs, cache, sh.slots[0], tid);
  for (int k0 = k_begin, i = 0; k0 < k_end; k0 += kTile, ++i) {
    __syncthreads();  // the previous tile's readers are done
    store_tile(sh, regs, tid);
    load_slots(sh.slots[(i + 2) % 3], slots, k0 + 2 * kTile, k_end, tid);
    if (k0 + kTile < k_end) load_tile(regs, cache, sh.slots[(i + 1) % 3], tid);
    __syncthreads();

    // S for this warp's rows of the tile: one accumulator per latent group (scaled by that
    // group's per-token scale afterwards) and one for the rope; the five chains interleave.
    const int t0 = kRowsPerWarp * warp;
    float acc[5][kNTiles][4] = {};
    #pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      #pragma unroll
      for (int g = 0; g < 5; ++g) {
        if (g == 4 && ks >= 4) continue;  // the rope is 64 wide: 4 k-steps
        const int kcol = g * 128 + ks * 16;
        unsigned a[4], kb[4];
        ldmatrix_x4(a, sh.q + (lane & 15) * kStride + kcol + (lane >> 4) * 8);
        if constexpr (kNTiles == 2) {
          ldmatrix_x4(kb, sh.kv + (t0 + (lane & 7) + ((lane >> 4) << 3)) * kStride + kcol + ((lane >> 3) & 1) * 8);
          mma(acc[g][0], a, kb[0], kb[1]);
          mma(acc[g][1], a, kb[2], kb[3]);
        } else {
          // One n8 tile: x2 gives its (k 0-7, k 8-15) fragments.
          asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                       : "=r"(kb[0]), "=r"(kb[1])
                       : "r"(smem_addr(sh.kv + (t0 + (lane & 7)) * kStride + kcol + ((lane >> 3) & 1) * 8)));
          mma(acc[g][0], a, kb[0], kb[1]);
        }
      }
    }
    float s[kNTiles][4];
    #pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int t = t0 + 8 * n + frag_col;
      #pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = acc[4][n][c];
      #pragma unroll
      for (int g = 0; g < 4; ++g) {
        const float s0 = sh.scale[g * kTile + t], s1 = sh.scale[g * kTile + t + 1];
        s[n][0] += acc[g][n][0] * s0; s[n][1] += acc[g][n][1] * s1;
        s[n][2] += acc[g][n][2] * s0; s[n][3] += acc[g][n][3] * s1;
      }
    }
    // Softmax over the tile's 64 rows: row maxima and sums are combined across the 4 warps.
    float tile_max[2] = {-kInf, -kInf};
    #pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int t = t0 + 8 * n + frag_col;
      const bool v0 = sh.valid[t] != 0.f, v1 = sh.valid[t + 1] != 0.f;
      s[n][0] = v0 ? s[n][0] * qk_scale_log2 : -kInf;
      s[n][1] = v1 ? s[n][1] * qk_scale_log2 : -kInf;
      s[n][2] = v0 ? s[n][2] * qk_scale_log2 : -kInf;
      s[n][3] = v1 ? s[n][3] * qk_scale_log2 : -kInf;
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s[n][0], s[n][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s[n][2], s[n][3]));
    }
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    }
    if ((lane & 3) == 0) {
      sh.red_max[warp * kHeads + frag_row] = tile_max[0];
      sh.red_max[warp * kHeads + frag_row + 8] = tile_max[1];
    }
    __syncthreads();
    float m_new[2], alpha[2], row_sum[2] = {0.f, 0.f};
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = frag_row + 8 * r;
      float mt = -kInf;
      #pragma unroll
      for (int w = 0; w < kWarps; ++w) mt = fmaxf(mt, sh.red_max[w * kHeads + h]);
      m_new[r] = fmaxf(m_run[r], mt);
      alpha[r] = exp2f(m_run[r] - m_new[r]);
    }
    #pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int t = t0 + 8 * n + frag_col;
      const float p0 = exp2f(s[n][0] - m_new[0]), p1 = exp2f(s[n][1] - m_new[0]);
      const float p2 = exp2f(s[n][2] - m_new[1]), p3 = exp2f(s[n][3] - m_new[1]);
      row_sum[0] += p0 + p1;
      row_sum[1] += p2 + p3;
      *reinterpret_cast<float2*>(sh.p + frag_row * kPStride + t) = make_float2(p0, p1);
      *reinterpret_cast<float2*>(sh.p + (frag_row + 8) * kPStride + t) = make_float2(p2, p3);
    }
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    }
    if ((lane & 3) == 0) {
      sh.red_sum[warp * kHeads + frag_row] = row_sum[0];
      sh.red_sum[warp * kHeads + frag_row + 8] = row_sum[1];
    }
    __syncthreads();
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = frag_row + 8 * r;
      float tile_sum = 0.f;
      #pragma unroll
      for (int w = 0; w < kWarps; ++w) tile_sum += sh.red_sum[w * kHeads + h];
      l_run[r] = l_run[r] * alpha[r] + tile_sum;
      m_run[r] = m_new[r];
    }

    // O += (P s_g / s_ref) V8 for this warp's columns, all in latent group g.
    const float* scale_g = sh.scale + group * kTile;
    float s_ref = 0.f;
    #pragma unroll
    for (int t = lane; t < kTile; t += 32) s_ref = fmaxf(s_ref, scale_g[t]);
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) s_ref = fmaxf(s_ref, __shfl_xor_sync(0xffffffffu, s_ref, off));
    if (!(s_ref > 0.f)) s_ref = 1.f;
    const float inv_ref = 1.f / s_ref;
    const float f0 = alpha[0] * o_unit * inv_ref, f1 = alpha[1] * o_unit * inv_ref;
    o_unit = s_ref;
    #pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      o[n][0] *= f0; o[n][1] *= f0; o[n][2] *= f1; o[n][3] *= f1;
    }
    #pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      const int t = 16 * j + frag_col;
      const float w0 = scale_g[t] * inv_ref, w1 = scale_g[t + 1] * inv_ref;
      const float w8 = scale_g[t + 8] * inv_ref, w9 = scale_g[t + 9] * inv_ref;
      const float2 pa = *reinterpret_cast<const float2*>(sh.p + frag_row * kPStride + t);
      const float2 pb = *reinterpret_cast<const float2*>(sh.p + (frag_row + 8) * kPStride + t);
      const float2 pc = *reinterpret_cast<const float2*>(sh.p + frag_row * kPStride + t + 8);
      const float2 pd = *reinterpret_cast<const float2*>(sh.p + (frag_row + 8) * kPStride + t + 8);
      const unsigned a[4] = {pack_f16x2(pa.x * w0, pa.y * w1), pack_f16x2(pb.x * w0, pb.y * w1),
                             pack_f16x2(pc.x * w8, pc.y * w9), pack_f16x2(pd.x * w8, pd.y * w9)};
      const unsigned short* v_rows = sh.kv + (16 * j + (lane & 7) + (((lane >> 3) & 1) << 3)) * kStride +
                                     warp * kColsPerWarp + ((lane >> 4) << 3);
      #pragma unroll
      for (int n = 0; n < kOTiles; n += 2) {
        unsigned vb[4];
        ldmatrix_x4_trans(vb, v_rows + n * 8);
        mma(o[n], a, vb[0], vb[1]);
        mma(o[n + 1], a, vb[2], vb[3]);
      }
    }
  }

  // out = O o_unit / l; lse in base e. A row that saw no valid token: out 0, lse -inf.
  const long long row_base = ((long long)split * B + b) * H;
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = frag_row + 8 * r;
    if (h >= H) continue;
    const bool any = l_run[r] > 0.f;
    const float f = any ? o_unit / l_run[r] : 0.f;
    unsigned short* dst = out + (row_base + h) * 512 + warp * kColsPerWarp + frag_col;
    #pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      *reinterpret_cast<unsigned*>(dst + 8 * n) = pack_bf16x2(o[n][2 * r] * f, o[n][2 * r + 1] * f);
    }
    if (warp == 0 && (lane & 3) == 0) {
      out_lse[row_base + h] = any ? (m_run[r] + log2f(l_run[r])) * 0.6931471805599453f : -kInf;
    }
  }
}

// Dynamic shared memory the kernel needs, read by the launcher (cuModuleGetGlobal).
extern "C" __device__ const int sparse_mla_decode_h16_shared_bytes = sizeof(Shared);
