// embedding.cu -- token embedding gather.
//
// Reference twin: reference/model.py, `x = embed_tokens.weight[input_ids]`.
//   out[t, :] = table[ids[t], :]            (exact copy)
// An id outside [0, V) writes a zero row (the engine rejects such ids before any launch; the
// kernel only refuses to read out of bounds).
// ids int32 [T]; table bf16 [V, H] contiguous; out bf16 [T, H] contiguous; H % 8 == 0.
// One thread per 16-byte chunk, grid-stride.

#include <cuda_bf16.h>

#include "pdl.cuh"

extern "C" __global__ void __launch_bounds__(256) embedding(const int* __restrict__ ids,
                                                            const __nv_bfloat16* __restrict__ table,
                                                            __nv_bfloat16* __restrict__ out, int T, int H, int V) {
  pdl_entry();
  const int chunks = H >> 3;
  const long long total = (long long)T * chunks;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int t = (int)(i / chunks);
    const int c = (int)(i - (long long)t * chunks);
    const int id = ids[t];
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (id >= 0 && id < V) val = *reinterpret_cast<const uint4*>(table + (long long)id * H + c * 8);
    *reinterpret_cast<uint4*>(out + (long long)t * H + c * 8) = val;
  }
}
