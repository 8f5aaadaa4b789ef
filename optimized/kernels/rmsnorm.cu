// rmsnorm.cu -- RMSNorm and the fused residual-add + RMSNorm.
//
// Reference twin: reference/model.py rms_norm (Hugging Face Qwen3RMSNorm):
//   hs  = x.float();  hs = hs * rsqrt(mean(hs^2) + eps)
//   out = w * hs.to(bf16)          (bf16 x bf16: fp32 product rounded once to bf16)
// add_rmsnorm: residual = bf16(residual + x) (written back in place, as the decoder layer's
// `x = x + o` in bf16), then out = rms_norm(residual).
// embed_rmsnorm: a decode step's first two launches in one (embedding.cu's gather, then rmsnorm):
// residual = table[ids[t]] (a zero row for an id outside [0, V)), out = rms_norm(residual); the
// bits of the pair, as both use rmsnorm_impl's arithmetic.
// rsqrt is computed as 1 / sqrt (both correctly rounded), as torch's CPU rsqrt does; only the
// order of the sum of squares differs from torch.
//
// One CTA per row; blockDim a multiple of 32 (<= 1024); H % 8 == 0; 16-byte loads/stores.
// Row strides in elements (x_stride, r_stride, out_stride) so rows may be slices of a larger buffer.

#include <cuda_bf16.h>

#include "norm.cuh"
#include "pdl.cuh"

namespace {

__device__ __forceinline__ float block_sum(float v, float* s_warp) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (lane == 0) s_warp[warp] = v;
  __syncthreads();
  float t = lane < nw ? s_warp[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;  // every thread holds the total
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

// one chunk of add_rmsnorm's first pass: s = bf16(r + x), returned and as floats in f, its squares added to ss
__device__ __forceinline__ uint4 add_chunk(const uint4& xv, const uint4& rv, float (&f)[8], float& ss) {
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
    ss += v.x * v.x + v.y * v.y;
  }
  return sv;
}

// the squares of a chunk added to ss
__device__ __forceinline__ void sq_chunk(const float (&f)[8], float& ss) {
#pragma unroll
  for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
}

// When every thread has at most one chunk (H <= 8 blockDim: every Qwen3 width at _norm_threads), all its
// loads -- x (and the residual) and the weight -- are issued in one round before the reduction, and the chunk
// stays in registers for the second pass; the loops after it (wider rows) load the rest after the reduction.
// Both give the same bits (the same chunk functions). The one round saves a trip to L2 on the critical path of
// a latency-bound launch: qwen3-8b batch 1 4.353 -> 4.330 ms a step, batch 8 4.777 -> 4.715, with RoPE's early
// loads (docs/performance/decode_step.md, "The decode step's latency at small batch").
__device__ __forceinline__ void rmsnorm_impl(const __nv_bfloat16* __restrict__ x, int x_stride,
                                             const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out,
                                             int out_stride, int H, float eps) {
  __shared__ float s_warp[32];
  const __nv_bfloat16* xr = x + (long long)blockIdx.x * x_stride;
  __nv_bfloat16* orow = out + (long long)blockIdx.x * out_stride;
  const int chunks = H >> 3;
  float ss = 0.f;
  if (chunks <= (int)blockDim.x) {
    const int c = threadIdx.x;
    float f[8];
    uint4 wv = make_uint4(0u, 0u, 0u, 0u);
    if (c < chunks) {
      unpack8(*reinterpret_cast<const uint4*>(xr + c * 8), f);
      wv = *reinterpret_cast<const uint4*>(w + c * 8);
      sq_chunk(f, ss);
    }
    const float r = inv_rms(block_sum(ss, s_warp), H, eps);
    if (c < chunks) *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, wv, r);
    return;
  }
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    unpack8(*reinterpret_cast<const uint4*>(xr + c * 8), f);
    sq_chunk(f, ss);
  }
  const float r = inv_rms(block_sum(ss, s_warp), H, eps);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    unpack8(*reinterpret_cast<const uint4*>(xr + c * 8), f);
    *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, *reinterpret_cast<const uint4*>(w + c * 8), r);
  }
}

// rmsnorm of row x (nullptr: a zero row) into orow, the row also copied to copy (embed_rmsnorm's residual):
// rmsnorm_impl's chunks, reduction and second pass, so the bits are rmsnorm's of the copied row.
__device__ __forceinline__ void copy_rmsnorm_row(const __nv_bfloat16* __restrict__ xr,
                                                 const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ orow,
                                                 __nv_bfloat16* __restrict__ copy, int H, float eps) {
  __shared__ float s_warp[32];
  const int chunks = H >> 3;
  float ss = 0.f;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  if (chunks <= (int)blockDim.x) {
    const int c = threadIdx.x;
    float f[8];
    uint4 wv = zero;
    if (c < chunks) {
      const uint4 xv = xr ? *reinterpret_cast<const uint4*>(xr + c * 8) : zero;
      wv = *reinterpret_cast<const uint4*>(w + c * 8);
      *reinterpret_cast<uint4*>(copy + c * 8) = xv;
      unpack8(xv, f);
      sq_chunk(f, ss);
    }
    const float r = inv_rms(block_sum(ss, s_warp), H, eps);
    if (c < chunks) *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, wv, r);
    return;
  }
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    const uint4 xv = xr ? *reinterpret_cast<const uint4*>(xr + c * 8) : zero;
    *reinterpret_cast<uint4*>(copy + c * 8) = xv;  // the same thread re-reads this chunk below
    unpack8(xv, f);
    sq_chunk(f, ss);
  }
  const float r = inv_rms(block_sum(ss, s_warp), H, eps);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    unpack8(*reinterpret_cast<const uint4*>(copy + c * 8), f);
    *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, *reinterpret_cast<const uint4*>(w + c * 8), r);
  }
}

__device__ __forceinline__ void add_rmsnorm_impl(const __nv_bfloat16* __restrict__ x, int x_stride,
                                                 __nv_bfloat16* __restrict__ residual, int r_stride,
                                                 const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out,
                                                 int out_stride, int H, float eps) {
  __shared__ float s_warp[32];
  const __nv_bfloat16* xr = x + (long long)blockIdx.x * x_stride;
  __nv_bfloat16* rr = residual + (long long)blockIdx.x * r_stride;
  __nv_bfloat16* orow = out + (long long)blockIdx.x * out_stride;
  const int chunks = H >> 3;
  float ss = 0.f;
  if (chunks <= (int)blockDim.x) {
    const int c = threadIdx.x;
    float f[8];
    uint4 wv = make_uint4(0u, 0u, 0u, 0u);
    if (c < chunks) {
      const uint4 xv = *reinterpret_cast<const uint4*>(xr + c * 8), rv = *reinterpret_cast<const uint4*>(rr + c * 8);
      wv = *reinterpret_cast<const uint4*>(w + c * 8);
      *reinterpret_cast<uint4*>(rr + c * 8) = add_chunk(xv, rv, f, ss);
    }
    const float r = inv_rms(block_sum(ss, s_warp), H, eps);
    if (c < chunks) *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, wv, r);
    return;
  }
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    *reinterpret_cast<uint4*>(rr + c * 8) =  // the same thread re-reads this chunk below
        add_chunk(*reinterpret_cast<const uint4*>(xr + c * 8), *reinterpret_cast<const uint4*>(rr + c * 8), f, ss);
  }
  const float r = inv_rms(block_sum(ss, s_warp), H, eps);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float f[8];
    unpack8(*reinterpret_cast<const uint4*>(rr + c * 8), f);
    *reinterpret_cast<uint4*>(orow + c * 8) = norm8(f, *reinterpret_cast<const uint4*>(w + c * 8), r);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(1024) rmsnorm(const __nv_bfloat16* __restrict__ x, int x_stride,
                                                           const __nv_bfloat16* __restrict__ w,
                                                           __nv_bfloat16* __restrict__ out, int out_stride, int H,
                                                           float eps) {
  pdl_entry();
  rmsnorm_impl(x, x_stride, w, out, out_stride, H, eps);
}

extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm(const __nv_bfloat16* __restrict__ x, int x_stride,
                                                               __nv_bfloat16* __restrict__ residual, int r_stride,
                                                               const __nv_bfloat16* __restrict__ w,
                                                               __nv_bfloat16* __restrict__ out, int out_stride, int H,
                                                               float eps) {
  pdl_entry();
  add_rmsnorm_impl(x, x_stride, residual, r_stride, w, out, out_stride, H, eps);
}

// One CTA per row t of ids [T]: residual [T, H] (contiguous) = table [V, H] row ids[t], out [T, H] = its rmsnorm.
extern "C" __global__ void __launch_bounds__(1024) embed_rmsnorm(const int* __restrict__ ids,
                                                                 const __nv_bfloat16* __restrict__ table, int V,
                                                                 __nv_bfloat16* __restrict__ residual,
                                                                 const __nv_bfloat16* __restrict__ w,
                                                                 __nv_bfloat16* __restrict__ out, int H, float eps) {
  pdl_entry();
  const int id = ids[blockIdx.x];
  const __nv_bfloat16* xr = id >= 0 && id < V ? table + (long long)id * H : nullptr;
  copy_rmsnorm_row(xr, w, out + (long long)blockIdx.x * H, residual + (long long)blockIdx.x * H, H, eps);
}
