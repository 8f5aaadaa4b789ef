// rmsnorm.cu -- RMSNorm and the fused residual-add + RMSNorm.
//
// Reference twin: reference/model.py rms_norm (Hugging Face Qwen3RMSNorm):
//   hs  = x.float();  hs = hs * rsqrt(mean(hs^2) + eps)
//   out = w * hs.to(bf16)          (bf16 x bf16: fp32 product rounded once to bf16)
// add_rmsnorm: residual = bf16(residual + x) (written back in place, as the decoder layer's
// `x = x + o` in bf16), then out = rms_norm(residual).
// rsqrt is computed as 1 / sqrt (both correctly rounded), as torch's CPU rsqrt does; only the
// order of the sum of squares differs from torch (that order, and the arithmetic, are norm.cuh's, shared
// with the add + RMSNorm prologue of skinny_gemm.cu's staged kernel).
//
// One CTA per row; blockDim a multiple of 32 (<= 1024); H % 8 == 0; 16-byte loads/stores.
// Row strides in elements (x_stride, r_stride, out_stride) so rows may be slices of a larger buffer.

#include <cuda_bf16.h>

#include "norm.cuh"
#include "pdl.cuh"

namespace {

// the sum over the CTA (norm.cuh's order: each warp's xor tree, then the warps' totals by a second tree)
__device__ __forceinline__ float block_sum(float v, float* s_warp) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (lane == 0) s_warp[warp] = v;
  __syncthreads();
  return warp_sum(lane < nw ? s_warp[lane] : 0.f);  // every thread holds the total
}

}  // namespace

extern "C" __global__ void __launch_bounds__(1024) rmsnorm(const __nv_bfloat16* __restrict__ x, int x_stride,
                                                           const __nv_bfloat16* __restrict__ w,
                                                           __nv_bfloat16* __restrict__ out, int out_stride, int H,
                                                           float eps) {
  pdl_entry();
  __shared__ float s_warp[32];
  const __nv_bfloat16* xr = x + (long long)blockIdx.x * x_stride;
  __nv_bfloat16* orow = out + (long long)blockIdx.x * out_stride;
  const int chunks = H >> 3;
  float ss = 0.f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    unpack8(*reinterpret_cast<const uint4*>(xr + c * 8), f);
    ss = __fadd_rn(ss, sumsq8(f));
  }
  const float r = inv_rms(block_sum(ss, s_warp), H, eps);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    unpack8(*reinterpret_cast<const uint4*>(xr + c * 8), f);
    *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, *reinterpret_cast<const uint4*>(w + c * 8), r);
  }
}

extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm(const __nv_bfloat16* __restrict__ x, int x_stride,
                                                               __nv_bfloat16* __restrict__ residual, int r_stride,
                                                               const __nv_bfloat16* __restrict__ w,
                                                               __nv_bfloat16* __restrict__ out, int out_stride, int H,
                                                               float eps) {
  pdl_entry();
  __shared__ float s_warp[32];
  const __nv_bfloat16* xr = x + (long long)blockIdx.x * x_stride;
  __nv_bfloat16* rr = residual + (long long)blockIdx.x * r_stride;
  __nv_bfloat16* orow = out + (long long)blockIdx.x * out_stride;
  const int chunks = H >> 3;
  float ss = 0.f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    const uint4 sv = add8(*reinterpret_cast<const uint4*>(xr + c * 8), *reinterpret_cast<const uint4*>(rr + c * 8), f);
    ss = __fadd_rn(ss, sumsq8(f));
    *reinterpret_cast<uint4*>(rr + c * 8) = sv;  // the same thread re-reads this chunk below
  }
  const float r = inv_rms(block_sum(ss, s_warp), H, eps);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    unpack8(*reinterpret_cast<const uint4*>(rr + c * 8), f);
    *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, *reinterpret_cast<const uint4*>(w + c * 8), r);
  }
}
