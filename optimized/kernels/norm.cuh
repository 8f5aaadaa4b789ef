// norm.cuh -- the arithmetic of RMSNorm, shared by rmsnorm.cu (rmsnorm, add_rmsnorm) and skinny_gemm.cu (the
// add + RMSNorm prologue of its staged kernel), so that both give the same bits.
//
// Reference twin: reference/model.py rms_norm; the rounding rule is in rmsnorm.cu's header. The order of the
// sum of squares is fixed here: each 8-column chunk's squares are summed in column order (sumsq8), the
// chunks of one thread in order, then a warp's 32 threads by the xor tree of warp_sum, then the warps by a
// second xor tree over the first nw lanes (zeros beyond). Every operation is an explicitly rounded
// intrinsic, so no fused multiply-add can change the order from one kernel to the other.
// Included with #include "norm.cuh" (pasted in before NVRTC compiles, like mma.cuh).
#pragma once

#include <cuda_bf16.h>

namespace {

// threads of the one-CTA-per-row norm kernels for rows of H columns (ops._norm_threads): one per 8-column
// chunk, rounded up to a warp, at most 1024; its warps are the terms of the sum's second tree
__host__ __device__ constexpr int norm_threads(int H) {
  const int t = (H / 8 + 31) / 32 * 32;
  return t < 32 ? 32 : (t > 1024 ? 1024 : t);
}

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = __bfloat1622float2(p[j]);
    f[2 * j] = x.x;
    f[2 * j + 1] = x.y;
  }
}

// bf16(r + x) of a chunk (the decoder layer's residual add), as bf16 and as floats
__device__ __forceinline__ uint4 add8(const uint4& xv, const uint4& rv, float (&f)[8]) {
  float a[8], b[8];
  unpack8(xv, a);
  unpack8(rv, b);
  uint4 sv;
  __nv_bfloat162* s2 = reinterpret_cast<__nv_bfloat162*>(&sv);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s2[j] = __floats2bfloat162_rn(__fadd_rn(b[2 * j], a[2 * j]), __fadd_rn(b[2 * j + 1], a[2 * j + 1]));
    const float2 v = __bfloat1622float2(s2[j]);
    f[2 * j] = v.x;
    f[2 * j + 1] = v.y;
  }
  return sv;
}

// the squares of a chunk, summed in column order
__device__ __forceinline__ float sumsq8(const float (&f)[8]) {
  float p = __fmul_rn(f[0], f[0]);
#pragma unroll
  for (int j = 1; j < 8; ++j) p = __fadd_rn(p, __fmul_rn(f[j], f[j]));
  return p;
}

// the xor tree over a warp's 32 lanes: every lane ends with the same bits (a + b == b + a at each level)
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// out chunk = bf16( w * bf16(x * r) )
__device__ __forceinline__ uint4 norm8(const float (&x)[8], const uint4& wv, float r) {
  float w[8];
  unpack8(wv, w);
  uint4 ov;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float n0 = __bfloat162float(__float2bfloat16_rn(__fmul_rn(x[2 * j], r)));
    const float n1 = __bfloat162float(__float2bfloat16_rn(__fmul_rn(x[2 * j + 1], r)));
    o[j] = __floats2bfloat162_rn(__fmul_rn(w[2 * j], n0), __fmul_rn(w[2 * j + 1], n1));
  }
  return ov;
}

// 1 / sqrt(mean + eps), both correctly rounded (as torch's CPU rsqrt)
__device__ __forceinline__ float inv_rms(float sumsq, int H, float eps) {
  return __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq, (float)H), eps)));
}

}  // namespace
