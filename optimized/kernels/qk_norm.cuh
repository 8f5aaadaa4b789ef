// qk_norm.cuh -- one head row's RMSNorm (q_norm / k_norm) and rotate-half RoPE, by one warp.
//
// The arithmetic of rope.cu's qk_norm_rope (its header has the formula), shared with the decode
// attention that does the same work in its own launch (attention.cu, split_kv_qk_partials): the two
// give the same bits because they run this code. Lane l holds elements j = l + 32c (c < 4, j < D/2)
// and j + D/2 of the row, so D <= 256.
//   qk_row_weight / qk_row_x / qk_row_tables / qk_row_v: the loads (weight, row, table entries at
//   position p, the V row stored beside a K row);
//   qk_row_inv_rms: 1 / sqrt(mean(x^2) + eps), the sum of squares reduced over the warp in a fixed tree;
//   qk_row_out: element pair c of the finished row (bf16).
#pragma once

#include <cuda_bf16.h>

namespace {

struct QkRow {
  float xa[4], xb[4], wa[4], wb[4], cs[4], sn[4];
};

__device__ __forceinline__ void qk_row_weight(QkRow& r, const __nv_bfloat16* __restrict__ w, int lane, int half) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = lane + 32 * c;
    if (j < half) {
      r.wa[c] = __bfloat162float(w[j]);
      r.wb[c] = __bfloat162float(w[j + half]);
    }
  }
}

__device__ __forceinline__ void qk_row_x(QkRow& r, const __nv_bfloat16* x, int lane, int half) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = lane + 32 * c;
    r.xa[c] = r.xb[c] = 0.f;
    if (j < half) {
      r.xa[c] = __bfloat162float(x[j]);
      r.xb[c] = __bfloat162float(x[j + half]);
    }
  }
}

// the lane's elements j and j + half of a V row (copied as they are, beside the finished K row)
__device__ __forceinline__ void qk_row_v(__nv_bfloat16 (&va)[4], __nv_bfloat16 (&vb)[4],
                                         const __nv_bfloat16* vrow, int lane, int half) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = lane + 32 * c;
    if (j < half) {
      va[c] = vrow[j];
      vb[c] = vrow[j + half];
    }
  }
}

// the table entries at position p (0 <= p < max_pos: the caller's test)
__device__ __forceinline__ void qk_row_tables(QkRow& r, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                              int p, int lane, int half) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = lane + 32 * c;
    if (j < half) {
      r.cs[c] = cos_t[(long long)p * half + j];
      r.sn[c] = sin_t[(long long)p * half + j];
    }
  }
}

// Per lane ss += xa^2 + xb^2 in c order, written out as the contraction nvcc made of that expression
// (xa * xa + rn(xb * xb) fused, then the add), then the xor tree over the warp.
__device__ __forceinline__ float qk_row_inv_rms(const QkRow& r, int lane, int half, int D, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (lane + 32 * c < half) ss = __fadd_rn(ss, __fmaf_rn(r.xa[c], r.xa[c], __fmul_rn(r.xb[c], r.xb[c])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
  return __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)D), eps)));
}

// elements j = lane + 32c and j + half of the finished row (rot: rotate at the loaded table entries)
__device__ __forceinline__ void qk_row_out(const QkRow& r, float inv, bool rot, int c, __nv_bfloat16& ra,
                                           __nv_bfloat16& rb) {
  const float na = __bfloat162float(__float2bfloat16_rn(__fmul_rn(r.xa[c], inv)));
  const float nb = __bfloat162float(__float2bfloat16_rn(__fmul_rn(r.xb[c], inv)));
  const float ya = __bfloat162float(__float2bfloat16_rn(__fmul_rn(r.wa[c], na)));
  const float yb = __bfloat162float(__float2bfloat16_rn(__fmul_rn(r.wb[c], nb)));
  float oa = ya, ob = yb;
  if (rot) {
    oa = __fadd_rn(__fmul_rn(ya, r.cs[c]), __fmul_rn(-yb, r.sn[c]));
    ob = __fadd_rn(__fmul_rn(yb, r.cs[c]), __fmul_rn(ya, r.sn[c]));
  }
  ra = __float2bfloat16_rn(oa);
  rb = __float2bfloat16_rn(ob);
}

}  // namespace
