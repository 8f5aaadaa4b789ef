// kv_cache.cu -- write new K/V rows into the paged cache.
//
// Reference twin: reference/kv_cache.py, KVCache.write: for every token t with
// slot = slot_mapping[t] >= 0 (slot = page * block_size + offset),
//   k_cache.view(-1, n_kv, D)[slot] = k[t];  v_cache.view(-1, n_kv, D)[slot] = v[t]
// slot < 0 marks a row to skip (padding). Exact copy (no arithmetic).
//
// k, v: bf16 [T, n_kv, D] with token row strides k_stride / v_stride (elements; the [n_kv, D]
// part contiguous, so k and v may be column slices of a fused qkv buffer).
// k_cache, v_cache: bf16 [num_blocks, block_size, n_kv, D], contiguous.
// One thread per 16-byte chunk (8 bf16); n_kv * D % 8 == 0 and 16-byte aligned rows (host checks).
//
// kv_prefetch (no reference twin: it moves bytes into L2 and writes nothing, so every output keeps its bits):
// ask L2 for the cached K and V pages of one layer ahead of its decode attention, while the GEMMs before that
// attention run (off by default: every engine step measured was slower with it, docs/performance/decode_step.md,
// "The next layer's K/V in L2, in the engine"). Sequence b's first
// min(ceil(lens[b] / bs), max_pages) pages of its row of the block table, one cp.async.bulk.prefetch.L2 (sm_90)
// of page_bytes each for K and V: nothing lands in shared memory, but a CTA ends only when its prefetches have
// landed in L2, so the pages are spread over gridDim.y CTAs a sequence (page j on CTA (b, j % gridDim.y)): the
// bulk copy units of many SMs issue them. The engine launches it on a side stream of its own, so no kernel of the
// step's chain waits for it (optimized/runner.py, _kv_prefetch). lines != 0: one prefetch.global.L2 a 128-byte line
// instead (an A/B alternative).

#include <cuda_bf16.h>

#include "pdl.cuh"

extern "C" __global__ void __launch_bounds__(256) store_kvcache(const __nv_bfloat16* __restrict__ k, int k_stride,
                                                                const __nv_bfloat16* __restrict__ v, int v_stride,
                                                                __nv_bfloat16* __restrict__ k_cache,
                                                                __nv_bfloat16* __restrict__ v_cache,
                                                                const int* __restrict__ slot_mapping, int T, int n_kv,
                                                                int D) {
  pdl_entry();
  const int chunks = (n_kv * D) >> 3;  // 16-byte chunks per token
  const long long total = (long long)T * chunks;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int t = (int)(i / chunks);
    const int c = (int)(i - (long long)t * chunks);
    const int slot = slot_mapping[t];
    if (slot < 0) continue;
    const uint4 kv = *reinterpret_cast<const uint4*>(k + (long long)t * k_stride + c * 8);
    const uint4 vv = *reinterpret_cast<const uint4*>(v + (long long)t * v_stride + c * 8);
    const long long dst = (long long)slot * n_kv * D + c * 8;
    *reinterpret_cast<uint4*>(k_cache + dst) = kv;
    *reinterpret_cast<uint4*>(v_cache + dst) = vv;
  }
}

// PDL (pdl.cuh): the kernel lets the next launch be scheduled first (on the step's own stream, the GEMM after it
// would start as early as without this launch); it reads before its wait only the step's block table and lengths,
// which no kernel writes, and writes nothing; its wait comes last, so it ends only after the kernel before it has
// ended and the kernel after it, waiting for it, still waits for that one (the order stays transitive).
extern "C" __global__ void __launch_bounds__(32) kv_prefetch(const char* __restrict__ k_cache,
                                                             const char* __restrict__ v_cache,
                                                             const int* __restrict__ tables,
                                                             const int* __restrict__ lens, int max_blocks, int bs,
                                                             long long page_bytes, int max_pages, int lines) {
  pdl_launch_dependents();
  const int b = blockIdx.x;
  const int n = min((lens[b] + bs - 1) / bs, max_pages);
  if (lines) {  // one prefetch.global.L2 a 128-byte line, the CTA's warp over each of its pages
    for (int j = blockIdx.y; j < n; j += gridDim.y) {
      const long long base = tables[(long long)b * max_blocks + j] * page_bytes;
      for (long long o = threadIdx.x * 128LL; o < page_bytes; o += blockDim.x * 128LL) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(k_cache + base + o));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(v_cache + base + o));
      }
    }
    pdl_wait();
    return;
  }
  for (int j = blockIdx.y + gridDim.y * threadIdx.x; j < n; j += gridDim.y * blockDim.x) {
    const long long off = tables[(long long)b * max_blocks + j] * page_bytes;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(k_cache + off), "r"((unsigned)page_bytes) : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(v_cache + off), "r"((unsigned)page_bytes) : "memory");
#endif
  }
  pdl_wait();
}
