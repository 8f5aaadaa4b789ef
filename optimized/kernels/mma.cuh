// mma.cuh -- the tensor-core and async-copy primitives shared by attention.cu and gemm.cu.
//
// Included with #include "mma.cuh": nvcc finds it beside the including file, and
// optimized/kernels/__init__.py pastes it in before NVRTC compiles (so CuPy's disk cache, keyed by
// the source text, sees a change here).
#pragma once
#include <cuda_bf16.h>

namespace {

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// 16-byte asynchronous global -> shared copy; pred == false zero-fills the 16 bytes and reads nothing.
//
// Cache operator: L1 = false bypasses L1 (.cg), L1 = true allocates in it (.ca). Which is faster
// depends on the kernel (H200, one process, the same bits; docs/performance.md "The copies' cache
// operator"):
// * the split-KV decode's K/V tiles, read once: with .cg the SMs received 806 MB from L2 for the
//   537 MB of keys and values a 32 x 4096 launch copies (a third of the sector requests came a second
//   time and hit in L2) and the kernel read 3.97 TB/s; with .ca 537 MB, 4.26 TB/s (-6 to -9% at
//   batch >= 8);
// * the paged prefill's K/V tiles, which many CTAs re-read from L2: .ca was 0.4-8.5% slower;
// * the batch-invariant GEMM: .ca up to 7% faster on the 16-row decode tiles, 7% faster to 7% slower
//   on the others.
// TK_CP_ASYNC_CG (an A/B switch of the device scripts) builds every copy with .cg, as before.
#ifdef TK_CP_ASYNC_CG
#define TK_CP_L1(l1) false
#else
#define TK_CP_L1(l1) (l1)
#endif
template <bool L1 = false>
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  if constexpr (TK_CP_L1(L1))
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// The same copy with cp.async's ignore-src operand: skip == true reads nothing and zero-fills the 16
// bytes. The predicate goes straight to the instruction (with the src-size form above, ptxas rebuilds
// it from the size register, several instructions a copy).
template <bool L1 = false>
__device__ __forceinline__ void cp_async16_or_zero(u32 dst, const void* src, bool skip) {
  if constexpr (TK_CP_L1(L1))
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %2, 0; cp.async.ca.shared.global [%0], [%1], 16, p; }\n" ::"r"(dst),
                 "l"(src), "r"((int)skip)
                 : "memory");
  else
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %2, 0; cp.async.cg.shared.global [%0], [%1], 16, p; }\n" ::"r"(dst),
                 "l"(src), "r"((int)skip)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// x2: lanes 0..15 give the row addresses of matrices 0 and 1 (the other lanes' are not read)
__device__ __forceinline__ void ldsm_x2(u32& r0, u32& r1, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// The transpose of an 8x8 b16 matrix held in fragment layout: a lane holding (row g, cols 2t, 2t+1)
// of the input receives (rows 2t, 2t+1; col g) of it, i.e. (row g, cols 2t, 2t+1) of the transpose.
__device__ __forceinline__ u32 movm_t(u32 a) {
  u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

// d += a * b  (m16n8k16, bf16 inputs, fp32 accumulate)
__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
  return *reinterpret_cast<u32*>(&v);
}

}  // namespace
