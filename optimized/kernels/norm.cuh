// norm.cuh -- RMSNorm's 1 / rms, which rmsnorm.cu and skinny_wg.cu's normed prologue share (reference twin:
// reference/model.py rms_norm): r = 1 / sqrt(sum of squares / H + eps), each operation correctly rounded (as
// torch's CPU rsqrt computes 1 / sqrt).
#pragma once

namespace {

__device__ __forceinline__ float inv_rms(float sumsq, int H, float eps) {
  return __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq, (float)H), eps)));
}

}  // namespace
