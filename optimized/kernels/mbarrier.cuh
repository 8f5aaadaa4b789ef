// mbarrier.cuh -- shared-memory mbarriers (sm_90): init, arrive, arrive with an expected byte count, and the
// wait on a phase's parity. Included by tma.cuh (its bulk and tensor copies complete on them) and by
// attention.cu (the warp-specialised prefill's full / empty slots). Needs u32 (mma.cuh) first.
#pragma once

namespace {

__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// S stage pairs 8 bytes apart: full[s] at full + 8 s (one arrival: the producer's, with the stage's bytes) and
// empty[s] at empty + 8 s (`consumers` arrivals). The caller fences them (mbar_fence_init) after its other inits.
template <int S>
__device__ __forceinline__ void mbar_init_stages(u32 full, u32 empty, int consumers) {
#pragma unroll
  for (int s = 0; s < S; ++s) {
    mbar_init(full + 8 * s, 1);
    mbar_init(empty + 8 * s, consumers);
  }
}
// the barriers' initialisation made visible to the async proxy (the copies) and the cluster
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// arrive where pred != 0, as a predicated instruction rather than a branch (see mbar_wait_uniform)
__device__ __forceinline__ void mbar_arrive_if(u32 bar, u32 pred) {
  asm volatile("{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n @p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
               "r"(pred)
               : "memory");
}
// spin until the barrier's phase of the given parity has completed
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
// the same wait as one asm block that loops on its own: to the compiler it is straight-line code, so warps that
// go on to issue wgmma after it are not seen as possibly divergent (with the C++ loop above ptxas serialised
// the wgmma of the code that follows, its advice C7518)
__device__ __forceinline__ void mbar_wait_uniform(u32 bar, u32 parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "TK_MBAR_WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra TK_MBAR_WAIT;\n}\n" ::"r"(bar), "r"(parity)
      : "memory");
}
}  // namespace
