// swiglu.cuh -- the SwiGLU product shared by activation.cu (silu_mul) and skinny_gemm.cu (its SwiGLU
// epilogue), so that both give the same bits.
//
// Reference twin: reference/model.py, silu(gate) * up; the rounding rule is in activation.cu's header.
// Included with #include "swiglu.cuh" (pasted in before NVRTC compiles, like mma.cuh).
#pragma once

namespace {

// silu(g) * u in fp32, rounded once by the caller: g / (1 + exp(-g)) * u
__device__ __forceinline__ float silu_mul1(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.f, expf(-g))), u);
}

}  // namespace
