// prefetch.cu -- L2 prefetch of a GEMM's weights, launched on a side stream of a decode step.
//
// No reference twin: these kernels move no value. They read nothing into registers, write nothing,
// and only ask the L2 for lines of a weight matrix that a cuBLAS GEMM a few launches later reads.
// Why (docs/performance.md, "L2 prefetch on a side stream"): in a small decode step the launches
// between two GEMMs (norms, RoPE, the attention of a short context) are latency-bound and leave
// DRAM idle for 3-11 us each, 36 times a step at qwen3-8b. The runner forks a side stream after a
// GEMM, launches one of these on it for the head of the next GEMM's weights, and joins it back just
// before that GEMM (optimized/runner.py, `_fork_prefetch` / `_join`); the lines arrive while the
// small kernels run, and the GEMM finds them in L2. An L2 line is coherent with every write, so a
// prefetch can never hand a kernel stale data: the result of every kernel is the same bits with or
// without it (benches/gpu/engine_smoke.py, `l2_prefetch_changes_nothing`).
//
//   l2_prefetch_bulk(p, bytes, chunk): `cp.async.bulk.prefetch.L2` of [p, p + bytes) in pieces of
//       `chunk` bytes, one piece per thread, grid-stride. p 16-byte aligned, bytes and chunk multiples
//       of 16 (checked by ops.l2_prefetch). A multiprocessor gets through these at only ~0.2 TB/s of
//       prefetched bytes (H200), so ops.l2_prefetch_grid spreads the pieces over every multiprocessor.
//   l2_prefetch_lines(p, bytes, chunk): `prefetch.global.L2` of every 128-byte line of the range, one
//       line per thread and step (`chunk` unused). The kernel of the sixth session's experiment, which
//       ran in the stream (docs/performance.md), kept for the A/B against the bulk form.
//
// Both begin with pdl_entry() like every kernel of the package (tests/test_kernel_sources.py): on the
// side stream the wait is for the previous prefetch, which holds nothing up.

#include "pdl.cuh"

extern "C" __global__ void __launch_bounds__(128) l2_prefetch_bulk(const char* __restrict__ p,
                                                                   unsigned long long bytes, unsigned int chunk) {
  pdl_entry();
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x * chunk;
  for (unsigned long long off = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * chunk; off < bytes;
       off += step) {
    const unsigned int n = (unsigned int)(bytes - off < chunk ? bytes - off : chunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(p + off)), "r"(n)
                 : "memory");
  }
}

extern "C" __global__ void __launch_bounds__(128) l2_prefetch_lines(const char* __restrict__ p,
                                                                    unsigned long long bytes, unsigned int chunk) {
  pdl_entry();
  (void)chunk;
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x * 128;
  for (unsigned long long off = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * 128; off < bytes;
       off += step)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p + off)) : "memory");
}
