// rope.cu -- fused per-head RMSNorm (q_norm / k_norm) + Qwen3 rotate-half RoPE, in place.
// (The per-row arithmetic is qk_norm.cuh's, shared with attention.cu's split_kv_qk_partials.)
//
// Reference twin: reference/model.py, `apply_rope(rms_norm(q, q_norm.weight), cos, sin)` and the same
// for k, in bf16 exactly as Hugging Face computes it:
//   n   = bf16( x * rsqrt(mean(x^2) + eps) )           per head, fp32 statistics
//   y   = bf16( w * n )                                 (bf16 weight times bf16, one rounding)
//   out[i]     = bf16( y[i] * cos[p, i] - y[i + D/2] * sin[p, i] )      i < D/2
//   out[i+D/2] = bf16( y[i + D/2] * cos[p, i] + y[i] * sin[p, i] )
// in fp32 with separate roundings of each product and of the sum (no FMA), matching torch's
// `x*cos + rotate_half(x)*sin` bit for bit given the same tables.
// cos, sin: fp32 [max_pos, D/2] computed on the host (the frequencies repeat over both halves).
// A position outside [0, max_pos) (e.g. a padding row's -1) gets the norm but no rotation.
// rotate_k == 0 (fused RoPE, rope_in_attention): k gets the norm only; the attention kernels rotate
// it when they read it (attention.cu, rotate_k_tile, with the same tables and operation order).
//
// q bf16 [T, n_q, D] (token stride q_stride), k bf16 [T, n_kv, D] (token stride k_stride): heads
// and D contiguous. One warp per (token, head); D even and D <= 256.
//
// Fused KV store (k_cache != null; twin: reference/kv_cache.py KVCache.write, kv_cache.cu's
// store_kvcache): the warp of K head j of token t with slot = slots[t] >= 0 also copies its finished
// row to k_cache.view(-1, n_kv, D)[slot, j] and v[t, j] (token stride v_stride) to v_cache -- the
// same bytes store_kvcache would write, one launch fewer per layer.

#include <cuda_bf16.h>

#include "pdl.cuh"

#include "qk_norm.cuh"

namespace {

// Every load a warp needs that waits for no other -- its row, the norm weight, the position, the slot and
// the V row -- is issued first, then the table entries at the position, all before the sum of squares'
// reduction (loading the weight, the tables and the V row after it, as before the sixteenth session, put one
// more trip to L2 on the critical path of this latency-bound launch; the same bits: docs/performance/decode_step.md,
// "The decode step's latency at small batch").
__device__ __forceinline__ void qk_norm_rope_impl(__nv_bfloat16* __restrict__ q, int q_stride,
                                                  __nv_bfloat16* __restrict__ k, int k_stride,
                                                  const __nv_bfloat16* __restrict__ q_w,
                                                  const __nv_bfloat16* __restrict__ k_w,
                                                  const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                                  const int* __restrict__ positions, int T, int n_q, int n_kv, int D,
                                                  int max_pos, float eps, int rotate_k,
                                                  const __nv_bfloat16* __restrict__ v, int v_stride,
                                                  __nv_bfloat16* __restrict__ k_cache,
                                                  __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ slots) {
  const int lane = threadIdx.x & 31;
  const long long gw = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int nh = n_q + n_kv;
  if (gw >= (long long)T * nh) return;  // whole warps exit together
  const int t = (int)(gw / nh);
  const int hh = (int)(gw - (long long)t * nh);
  __nv_bfloat16* x = hh < n_q ? q + (long long)t * q_stride + (long long)hh * D
                              : k + (long long)t * k_stride + (long long)(hh - n_q) * D;
  const __nv_bfloat16* w = hh < n_q ? q_w : k_w;
  const int half = D >> 1;
  const bool store = k_cache != nullptr && hh >= n_q;  // fused KV store: a K head's warp writes K and V rows
  const __nv_bfloat16* vrow = v + (long long)t * v_stride + (long long)(hh - n_q) * D;

  const int p = positions[t];
  const int slot = store ? slots[t] : -1;
  QkRow row;
  __nv_bfloat16 va[4], vb[4];
  qk_row_x(row, x, lane, half);
  qk_row_weight(row, w, lane, half);
  if (store) qk_row_v(va, vb, vrow, lane, half);
  const bool rot = p >= 0 && p < max_pos && (hh < n_q || rotate_k != 0);
  if (rot) qk_row_tables(row, cos_t, sin_t, p, lane, half);
  const float r = qk_row_inv_rms(row, lane, half, D, eps);
  const long long dst = (long long)slot * n_kv * D + (long long)(hh - n_q) * D;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = lane + 32 * c;
    if (j < half) {
      __nv_bfloat16 ra, rb;
      qk_row_out(row, r, rot, c, ra, rb);
      x[j] = ra;
      x[j + half] = rb;
      if (slot >= 0) {
        k_cache[dst + j] = ra;
        k_cache[dst + j + half] = rb;
        v_cache[dst + j] = va[c];
        v_cache[dst + j + half] = vb[c];
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128) qk_norm_rope(__nv_bfloat16* __restrict__ q, int q_stride,
                                                               __nv_bfloat16* __restrict__ k, int k_stride,
                                                               const __nv_bfloat16* __restrict__ q_w,
                                                               const __nv_bfloat16* __restrict__ k_w,
                                                               const float* __restrict__ cos_t,
                                                               const float* __restrict__ sin_t,
                                                               const int* __restrict__ positions, int T, int n_q,
                                                               int n_kv, int D, int max_pos, float eps,
                                                               int rotate_k, const __nv_bfloat16* __restrict__ v,
                                                               int v_stride, __nv_bfloat16* __restrict__ k_cache,
                                                               __nv_bfloat16* __restrict__ v_cache,
                                                               const int* __restrict__ slots,
                                                               int trigger_first) {
  // trigger_first: the next launch may start before this one waits (ops.qk_norm_rope's trigger_first: a decode
  // step's split_kv_early_partials, which reads before its own wait only what no running kernel writes)
  if (trigger_first) pdl_launch_dependents();
  pdl_entry();
  qk_norm_rope_impl(q, q_stride, k, k_stride, q_w, k_w, cos_t, sin_t, positions, T, n_q, n_kv, D, max_pos, eps,
                    rotate_k, v, v_stride, k_cache, v_cache, slots);
}
