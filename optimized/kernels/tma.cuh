// tma.cuh -- Hopper's asynchronous copies and their barriers, shared by the kernels that stream through shared
// memory (skinny_gemm.cu's staged and cluster kernels, skinny_wg.cu): mbarriers, bulk and tensor copies
// (cp.async.bulk{.tensor}), the L2 eviction policy of a weight stream, and the thread-block cluster's rank,
// barrier and remote arrivals. Included with #include "tma.cuh" after mma.cuh (u32, u64).
#pragma once

#include "mbarrier.cuh"

namespace {

// bytes (a multiple of 16) from global src to shared dst (both 16-byte aligned); completion counted on bar
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// the same with an L2 eviction policy for the lines the copy brings in (createpolicy)
__device__ __forceinline__ void bulk_copy_hint(u32 dst, const void* src, u32 bytes, u32 bar, u64 policy) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
               : "memory");
}
// The weight copies at L2 priority evict-first (evict != 0; else copies without a hint). A decode step streams
// ~15 GB of weights (qwen3-8b) through a 50 MB L2, each line read once; at the default priority they push
// out what the step's small kernels read next -- the residual rows an add_rmsnorm reads, written a layer's
// weights earlier, and the KV cache the attention reads again the next step.
__device__ __forceinline__ u64 l2_evict_first() {
  u64 p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// byte offset in a 1024-byte-aligned box of the logical offset `off` (the 128-byte swizzle the tensor copies of
// ops.py's maps write: 16-byte piece j of 128-byte line l lands at piece j ^ (l mod 8))
__device__ __forceinline__ u32 swz128(u32 off) { return off ^ ((off >> 3) & 0x70u); }

struct __align__(64) TensorMap {  // CUtensorMap: opaque, 128 bytes, encoded by the driver on the host
  unsigned long long v[16];
};
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// every thread of every CTA of the cluster (release / acquire)
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// every thread of every CTA of the cluster, with no memory ordering on the arrival: for a kernel's last barrier,
// which only keeps a CTA resident while a peer may still reach its shared memory, where every remote access has been
// waited on before it. With .release each thread first waits until its global stores are performed at cluster
// scope (skinny_wg.cu's last barrier; sixty-second session)
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// arrive on the mbarrier at this CTA's shared address `bar` in cluster CTA `cta`. The arrival says "this stage's
// shared memory has been read" (its loads have returned: their MMAs were issued before it), so it needs no
// cluster-scope release: with .release.cluster each arrival waited on a memory barrier (Nsight Compute's
// "membar" stall, ~1 µs a stage; docs/performance.md), at .cta scope it does not.
__device__ __forceinline__ void mbar_arrive_peer(u32 bar, u32 cta) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(cta));
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// the box of the 3-D tensor map `map` at (c0, c1, c2) into this CTA's shared dst, completion counted on bar
__device__ __forceinline__ void tensor_copy(u32 dst, const TensorMap* map, int c0, int c1, int c2, u32 bar,
                                            u64 policy, int evict) {
  const unsigned long long m = reinterpret_cast<unsigned long long>(map);
  if (evict)
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
// the same box into the shared dst of every cluster CTA in `mask`, completion counted on each one's bar.
// (ptxas advises the sm_90a target for .multicast::cluster, for the sake of later architectures; on sm_90 it is
// the Hopper instruction either way.)
__device__ __forceinline__ void tensor_copy_multicast(u32 dst, const TensorMap* map, int c0, int c1, int c2, u32 bar,
                                                      unsigned short mask) {
  const unsigned long long m = reinterpret_cast<unsigned long long>(map);
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}

// the box of the 5-D tensor map `map` at (c0 .. c4) into this CTA's shared dst, completion counted on bar, at L2
// priority `policy` where evict != 0 (skinny_wg.cu's SwiGLU weights: gate and up rows interleaved by 8)
__device__ __forceinline__ void tensor_copy5(u32 dst, const TensorMap* map, int c0, int c1, int c2, int c3, int c4,
                                             u32 bar, u64 policy, int evict) {
  const unsigned long long m = reinterpret_cast<unsigned long long>(map);
  if (evict)
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;\n" ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
        "r"(c4), "r"(bar), "l"(policy)
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
        "r"(bar)
        : "memory");
}
// four floats into the shared memory of cluster CTA `cta` at its shared address `dst`, completion counted (16
// bytes) on that CTA's mbarrier at its address `bar` (st.async: no fence, the barrier's phase says they landed)
__device__ __forceinline__ void st_async_f4(u32 dst, u32 bar, u32 cta, float a, float b, float c, float d) {
  u32 rdst, rbar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rdst) : "r"(dst), "r"(cta));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rbar) : "r"(bar), "r"(cta));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(rdst), "f"(a), "f"(b), "f"(c), "f"(d), "r"(rbar)
               : "memory");
}

}  // namespace
