// xload_probe.cu -- the probe kernel of benches/gpu/probe_xload.py (not part of the engine).
//
// What a warpgroup GEMM CTA's x copies cost after its PDL wait. Each CTA (one a multiprocessor: the launch reserves
// most of its shared memory) copies `chunks` stages of x, each a box of (64 columns, `rows` rows, kc / 64 blocks)
// through the tensor map xmap (ops' "block" layout, skinny_wg.cu's), all issued at once by thread 0 as the GEMM's
// producer issues them, each stage completing on its own mbarrier. Before the copies every CTA of the grid meets
// at a counter in global memory (start[0]), so that all of them ask L2 for x at once, as the GEMM's CTAs do when
// their wait is passed. MODE says whose x and by whom:
//   0  same:    every CTA copies the same x, stage 0 first (the engine);
//   1  rotate:  the same x, CTA b's stages in the order b, b + 1, .. (mod chunks): the CTAs ask for different lines;
//   2  own:     CTA b copies its own x (rows b rows .. of a taller matrix): no two CTAs read the same line;
//   3  mcast:   clusters of C CTAs: rank r copies the rows r rows / C .. of every stage (xmap's box has rows / C
//               rows) into the same place of every CTA of the cluster by one multicast copy; L2 serves x once a
//               cluster.
// Thread 0 records %globaltimer and clock64 after the meeting (a %globaltimer of 0 where the meeting timed out: the
// grid was not all resident), when stage 0 has landed and when the last has: the SM's cycles time a CTA's own
// intervals, %globaltimer (which ticks coarsely on some GPUs: xload_clock measures its step) the grid's. Then every
// thread adds up the bf16 values of its share of the stages (the landed layout does not change the sum) and the
// CTA's sum goes to sums[b], which the host compares with x's own.
#include <cuda_bf16.h>

#include "mma.cuh"
#include "tma.cuh"

__device__ __forceinline__ unsigned long long xl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

template <int MODE>
__device__ __forceinline__ void xload(const TensorMap* xmap, int chunks, int kc, int rows, int cluster,
                                      unsigned* start, float* sums, unsigned long long* marks) {
  extern __shared__ __align__(128) unsigned char xl_smem[];
  __shared__ __align__(8) u64 bars[16];
  __shared__ float part[4];
  const int tid = threadIdx.x, b = blockIdx.x;
  const u32 stage_bytes = (u32)(kc * rows * 2);
  const u32 base = (smem_u32(xl_smem) + 1023u) & ~1023u;
  const u32 bar0 = smem_u32(bars);
  if (tid == 0) {
    for (int s = 0; s < chunks; ++s) mbar_init(bar0 + 8 * s, 1);
    mbar_fence_init();
  }
  if (MODE == 3)
    cluster_sync_all();  // every peer's barriers exist before a multicast reaches them
  else
    __syncthreads();
  unsigned long long t0 = 0, t_first = 0, t_last = 0, c0 = 0, c_first = 0, c_last = 0;
  if (tid == 0) {
    atomicAdd(start, 1u);
    unsigned v;
    long long spins = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(start) : "memory");
    } while (v < gridDim.x && ++spins < (1ll << 20));
    t0 = v < gridDim.x ? 0ull : xl_now();  // 0: the grid was not all resident (the host reports it)
    c0 = clock64();
    const u32 rank = MODE == 3 ? cluster_rank() : 0u;
    for (int i = 0; i < chunks; ++i) {
      const int s = MODE == 1 ? (i + b) % chunks : i;
      const u32 dst = base + (u32)s * stage_bytes, bar = bar0 + 8 * s;
      mbar_expect_tx(bar, stage_bytes);
      if constexpr (MODE == 3)
        tensor_copy_multicast(dst + rank * (stage_bytes / cluster), xmap, 0, (int)rank * (rows / cluster), s * kc / 64,
                              bar, (unsigned short)((1u << cluster) - 1u));
      else
        tensor_copy(dst, xmap, 0, MODE == 2 ? b * rows : 0, s * kc / 64, bar, 0ull, 0);
    }
    mbar_wait(bar0 + 8 * (MODE == 1 ? b % chunks : 0), 0u);
    c_first = clock64();
    t_first = xl_now();
    for (int s = 0; s < chunks; ++s) mbar_wait(bar0 + 8 * s, 0u);
    c_last = clock64();
    t_last = xl_now();
  }
  __syncthreads();
  for (int s = 0; s < chunks; ++s) mbar_wait(bar0 + 8 * s, 0u);  // every thread sees the landed bytes
  float sum = 0.f;
  const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(xl_smem + (base - smem_u32(xl_smem)));
  for (int e = tid; e < chunks * kc * rows; e += blockDim.x) sum += __bfloat162float(p[e]);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((tid & 31) == 0) part[tid >> 5] = sum;
  __syncthreads();
  if (tid == 0) {
    sums[b] = part[0] + part[1] + part[2] + part[3];
    unsigned long long* m = marks + 6 * b;
    m[0] = t0;
    m[1] = t_first;
    m[2] = t_last;
    m[3] = c0;
    m[4] = c_first;
    m[5] = c_last;
  }
  if (MODE == 3) cluster_sync_all();  // nobody leaves while a peer's multicast may still land in it
}

#define XLOAD_KERNEL(name, mode)                                                                                  \
  extern "C" __global__ void __launch_bounds__(128) name(const __grid_constant__ TensorMap xmap, int chunks,     \
                                                         int kc, int rows, int cluster, unsigned* start,         \
                                                         float* sums, unsigned long long* marks) {               \
    xload<mode>(&xmap, chunks, kc, rows, cluster, start, sums, marks);                                            \
  }
XLOAD_KERNEL(xload_same, 0)
XLOAD_KERNEL(xload_rotate, 1)
XLOAD_KERNEL(xload_own, 2)
XLOAD_KERNEL(xload_mcast, 3)

// The clocks: out[0], out[1] = the ns and SM cycles of a spin of 2^22 cycles (the SM clock's rate); out[2] = the
// smallest nonzero step of %globaltimer over 2^16 reads, out[3] = how many distinct values those reads saw.
extern "C" __global__ void xload_clock(unsigned long long* out) {
  if (threadIdx.x != 0) return;
  const unsigned long long g0 = xl_now(), c0 = clock64();
  while (clock64() - c0 < (1ull << 22)) {
  }
  const unsigned long long g1 = xl_now(), c1 = clock64();
  unsigned long long prev = xl_now(), step = ~0ull, seen = 1;
  for (int i = 0; i < (1 << 16); ++i) {
    const unsigned long long t = xl_now();
    if (t != prev) {
      step = min(step, t - prev);
      ++seen;
      prev = t;
    }
  }
  out[0] = g1 - g0;
  out[1] = c1 - c0;
  out[2] = step;
  out[3] = seen;
}
