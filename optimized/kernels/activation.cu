// activation.cu -- SwiGLU activation of the MLP.
//
// Reference twin: reference/model.py, `silu(gate_proj(m)) * up_proj(m)` with gate and up fused in
// one GEMM output: x bf16 [T, 2*I] = [gate | up] along the last dimension.
//   out[t, i] = bf16( silu(g) * u ),  silu(g) = g / (1 + exp(-g)),  g = x[t, i], u = x[t, I + i]
// computed in fp32 and rounded once (torch's bf16 run rounds silu(g) to bf16 first; the fp32
// version is the more accurate of the two).
// x row stride x_stride (elements), out bf16 [T, I] contiguous; I % 8 == 0. 16-byte loads/stores.

#include <cuda_bf16.h>

#include "swiglu.cuh"
#include "pdl.cuh"

extern "C" __global__ void __launch_bounds__(256) silu_mul(const __nv_bfloat16* __restrict__ x, int x_stride,
                                                           __nv_bfloat16* __restrict__ out, int T, int I) {
  pdl_entry();
  const int chunks = I >> 3;
  const long long total = (long long)T * chunks;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int t = (int)(i / chunks);
    const int c = (int)(i - (long long)t * chunks);
    const __nv_bfloat16* row = x + (long long)t * x_stride;
    const uint4 gv = *reinterpret_cast<const uint4*>(row + c * 8);
    const uint4 uv = *reinterpret_cast<const uint4*>(row + I + c * 8);
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
    uint4 ov;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 g = __bfloat1622float2(g2[j]);
      const float2 u = __bfloat1622float2(u2[j]);
      o2[j] = __floats2bfloat162_rn(silu_mul1(g.x, u.x), silu_mul1(g.y, u.y));
    }
    *reinterpret_cast<uint4*>(out + (long long)t * I + c * 8) = ov;
  }
}
