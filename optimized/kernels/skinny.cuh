// skinny.cuh -- what the skinny GEMM kernels (skinny_gemm.cu, skinny_wg.cu) share: the epilogue kinds and the
// store of one C fragment (plain bf16 / fp32, or the SwiGLU product of a gate and an up row). Included after
// mma.cuh and swiglu.cuh.
#pragma once

namespace {

// kResidual: skinny_wg.cu's residual epilogue (its own store, residual_store)
enum Epilogue { kPlain = 0, kSwiGLU = 1, kResidual = 2 };

// The epilogue's store of one C fragment (lane l of the n8 tile of x rows m0 .. m0+7), summed in
// fp32: tile `tile` of 16 weight rows (plain: output columns 16 tile .. +15; SwiGLU: 8 gate and 8 up
// rows, output columns 8 tile .. +7). C fragment: c0, c1 -> (row gg, x rows 2tt, 2tt+1); c2, c3 -> row
// gg + 8, the same x rows.
template <bool F32, int EPI>
__device__ __forceinline__ void skinny_store(void* __restrict__ y, const float (&sum)[4], int tile, int m0, int l,
                                             int M, int N) {
  const int gg = l >> 2, tt = l & 3;
  if constexpr (EPI == kSwiGLU) {  // rows gg and gg + 8: gate and up of output column 8 tile + gg
    const int n = tile * 8 + gg;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int m = m0 + 2 * tt + c;
      if (n < N && m < M) {
        const float gt = __bfloat162float(__float2bfloat16_rn(sum[c]));
        const float up = __bfloat162float(__float2bfloat16_rn(sum[c + 2]));
        reinterpret_cast<__nv_bfloat16*>(y)[(long long)m * N + n] = __float2bfloat16_rn(silu_mul1(gt, up));
      }
    }
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int n = tile * 16 + gg + 8 * (c >> 1);
      const int m = m0 + 2 * tt + (c & 1);
      if (n < N && m < M) {
        if constexpr (F32)
          reinterpret_cast<float*>(y)[(long long)m * N + n] = sum[c];
        else
          reinterpret_cast<__nv_bfloat16*>(y)[(long long)m * N + n] = __float2bfloat16_rn(sum[c]);
      }
    }
  }
}

}  // namespace
