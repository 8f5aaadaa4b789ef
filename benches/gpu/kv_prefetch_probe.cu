// kv_prefetch_probe.cu -- the probe kernel of benches/gpu/probe_kv_l2.py (not part of the engine).
//
// kv_prefetch_l2 asks L2 for every cached page of sequence blockIdx.x (its first ceil(lens[b] / bs) pages of the
// block table), K and V, by one bulk prefetch a page (cp.async.bulk.prefetch.L2, sm_90): fire and forget, nothing
// lands in shared memory and nothing waits, so the kernel ends while the bytes are still on their way.
extern "C" __global__ void kv_prefetch_l2(const char* __restrict__ k, const char* __restrict__ v,
                                          const int* __restrict__ tables, const int* __restrict__ lens, int max_blocks,
                                          int bs, unsigned page_bytes) {
  const int b = blockIdx.x, n = (lens[b] + bs - 1) / bs;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const long long off = (long long)tables[b * max_blocks + j] * page_bytes;
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(k + off), "r"(page_bytes) : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(v + off), "r"(page_bytes) : "memory");
#endif
  }
}
