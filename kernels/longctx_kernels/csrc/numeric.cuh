// Number conversions and fast math shared by the sparse-MLA kernels (NVRTC passes every
// csrc/*.cuh to each program as a header).
#pragma once

// Two e4m3 values (the low or high half of v) -> fp16x2, exact.
__device__ __forceinline__ unsigned e4m3x2_lo(unsigned v) {
  unsigned out;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(out) : "r"(v));
  return out;
}

__device__ __forceinline__ unsigned e4m3x2_hi(unsigned v) {
  unsigned out;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(out) : "r"(v));
  return out;
}

__device__ __forceinline__ unsigned byte_perm(unsigned a, unsigned b, unsigned selector) {
  unsigned out;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(out) : "r"(a), "r"(b), "r"(selector));
  return out;
}

// 2^x, -inf -> 0: the bare MUFU instruction (exp2f adds a fix-up for inputs below -126, where the
// probabilities are 0 for fp16 anyway).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
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
