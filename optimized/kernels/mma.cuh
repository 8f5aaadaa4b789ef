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
// depends on the kernel (H200, one process, the same bits; docs/performance/decode_attention.md "The copies' cache
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

// ---- Hopper warpgroup MMA (wgmma.mma_async), compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL:
// optimized/kernels/__init__.py builds attention.cu for sm_90a on a compute-capability-9.0 device).
// A warpgroup (4 consecutive warps, 128 threads) multiplies a 64-row A by an N-column B from shared
// memory. With A in registers, warp w of the group holds rows 16w..16w+15 of A and of D in exactly the
// m16n8k16 fragment layouts above (A: a0..a3 per 16-column k-step; D: for each 8-column group j,
// d[j][0..1] = (row g, cols 8j+2t, +1), d[j][2..3] = (row g+8, same cols)).
//
// B in shared memory is described by a 64-bit descriptor (PTX ISA, "Matrix Descriptor Format"): bits
// 0-13 the start address >> 4, 16-29 the leading-dimension byte offset >> 4, 32-45 the stride-dimension
// byte offset >> 4, 62-63 the swizzle mode (1: 128-byte, the one used here). In the 128-byte-swizzled
// canonical layouts ("Canonical Layouts" of the PTX ISA) a row of 128 bytes holds 64 bf16 along the
// operand's contiguous dimension, 8 rows make a 1024-byte atom, and the 16-byte chunk k of row r sits
// at chunk position k ^ (r % 8) (the hardware applies the XOR to address bits 4-6 from bits 7-9, so
// atoms start on 1024-byte boundaries). K-major B (rows along K, N-rows stacked): stride offset = the
// step between 8-row groups along N, leading offset unused; a 16-element k-step starts 32 bytes
// further. MN-major B (rows along N, K-rows stacked; imm-trans-b = 1): stride offset = the step
// between 8-row groups along K, leading offset = the step between 64-element column slabs along N.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TK_WGMMA 1
__device__ __forceinline__ u64 wg_desc_sw128(u32 saddr, u32 lead_bytes, u32 stride_bytes) {
  return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)(lead_bytes >> 4) << 16) | ((u64)(stride_bytes >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Shared memory written by the generic proxy (cp.async, st.shared) becomes visible to the async proxy
// that wgmma reads it through: each writer fences after its writes, before the barrier.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving an accumulator across the asynchronous MMA's issue and wait.
template <int J>
__device__ __forceinline__ void wg_fence_regs(float (&d)[J][4]) {
#pragma unroll
  for (int j = 0; j < J; ++j) asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

#define TK_F4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
// d (64 x 64, fp32) = A (64 x 16, registers) . B (16 x 64, K-major in shared memory) + (ACC ? d : 0)
template <int ACC>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const u32 (&a)[4], u64 desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
      "%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : TK_F4(d, 0), TK_F4(d, 1), TK_F4(d, 2), TK_F4(d, 3), TK_F4(d, 4), TK_F4(d, 5), TK_F4(d, 6), TK_F4(d, 7)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(ACC));
}
// d (64 x 128, fp32) += A (64 x 16, registers) . B (16 x 128, MN-major in shared memory)
__device__ __forceinline__ void wgmma_m64n128k16_tb(float (&d)[16][4], const u32 (&a)[4], u64 desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
      "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,"
      "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : TK_F4(d, 0), TK_F4(d, 1), TK_F4(d, 2), TK_F4(d, 3), TK_F4(d, 4), TK_F4(d, 5), TK_F4(d, 6), TK_F4(d, 7),
        TK_F4(d, 8), TK_F4(d, 9), TK_F4(d, 10), TK_F4(d, 11), TK_F4(d, 12), TK_F4(d, 13), TK_F4(d, 14), TK_F4(d, 15)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
// d (64 x 8J, fp32) = A (64 x 16, K-major in shared memory) . B (16 x 8J, K-major in shared memory) + (acc ? d : 0),
// J = 4 or 8 (skinny_wg.cu: A the weight rows, B the x rows)
__device__ __forceinline__ void wgmma_ss_m64n32k16(float (&d)[4][4], u64 desc_a, u64 desc_b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : TK_F4(d, 0), TK_F4(d, 1), TK_F4(d, 2), TK_F4(d, 3)
      : "l"(desc_a), "l"(desc_b), "r"(acc));
}
__device__ __forceinline__ void wgmma_ss_m64n64k16(float (&d)[8][4], u64 desc_a, u64 desc_b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
      "%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : TK_F4(d, 0), TK_F4(d, 1), TK_F4(d, 2), TK_F4(d, 3), TK_F4(d, 4), TK_F4(d, 5), TK_F4(d, 6), TK_F4(d, 7)
      : "l"(desc_a), "l"(desc_b), "r"(acc));
}
#undef TK_F4
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace
