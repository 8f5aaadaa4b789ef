// mma_probe.cu -- the probe kernel of benches/gpu/probe_mma.py (not part of the engine).
//
// The MMA phase of a warpgroup GEMM CTA alone: skinny_wg.cu's consumer loop over `stages` stages that are already
// in shared memory (no copies, no barriers), one unit of 64 weight rows (the wgmma's M) times NX = 8 J x rows (its
// N: 32 or 64 in the engine; 16, 128 and 256 here too, for how a wgmma's cost grows with N), 128 columns of K a stage
// in eight 16-column steps, both operands read from shared memory through the kernel's descriptors (128-byte
// swizzle, the same offsets). MODE:
//   0  the engine's: each stage's wgmmas one group, then wait until all but that group are done (wait_group 1);
//   1  every stage's groups issued before one wait at the end: the tensor cores' own rate;
//   2  as 0 with two accumulator chains (the even and the odd 16-column steps, as skinny_wg.cu's build switch
//      TK_WG_TWO_CHAINS did until the sixty-second session);
//   3  as 0, then wait until this stage's group is done too (wait_group 0): no stage overlaps the next, as in the
//      engine's build up to the sixty-second session, where ptxas put such a wait on its stage loop's back edge.
// Every stage byte holds bf16 1.0 (0x3F80), so every output is stages * 128 exactly: the host checks each CTA's
// count of wrong outputs (wrong[b]). Thread 0 records the SM's clock64 cycles from the first wgmma's fence to the
// last wait (cycles[b]).
#include <cuda_bf16.h>

#include "mma.cuh"

#if defined(TK_WGMMA)
// m64nNk16 with both operands in shared memory for the N that mma.cuh does not have (16, 128, 256)
#define MP_F4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
__device__ __forceinline__ void mp_wgmma_n16(float (&d)[2][4], u64 desc_a, u64 desc_b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}"
      ", %8, %9, p, 1, 1, 0, 0;\n}\n"
      : MP_F4(d, 0), MP_F4(d, 1)
      : "l"(desc_a), "l"(desc_b), "r"(acc));
}
__device__ __forceinline__ void mp_wgmma_n128(float (&d)[16][4], u64 desc_a, u64 desc_b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
      "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"
      "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MP_F4(d, 0), MP_F4(d, 1), MP_F4(d, 2), MP_F4(d, 3), MP_F4(d, 4), MP_F4(d, 5), MP_F4(d, 6), MP_F4(d, 7),
        MP_F4(d, 8), MP_F4(d, 9), MP_F4(d, 10), MP_F4(d, 11), MP_F4(d, 12), MP_F4(d, 13), MP_F4(d, 14), MP_F4(d, 15)
      : "l"(desc_a), "l"(desc_b), "r"(acc));
}
__device__ __forceinline__ void mp_wgmma_n256(float (&d)[32][4], u64 desc_a, u64 desc_b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
      "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"
      "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,"
      "%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,"
      "%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,"
      "%121,%122,%123,%124,%125,%126,%127}"
      ", %128, %129, p, 1, 1, 0, 0;\n}\n"
      : MP_F4(d, 0), MP_F4(d, 1), MP_F4(d, 2), MP_F4(d, 3), MP_F4(d, 4), MP_F4(d, 5), MP_F4(d, 6), MP_F4(d, 7),
        MP_F4(d, 8), MP_F4(d, 9), MP_F4(d, 10), MP_F4(d, 11), MP_F4(d, 12), MP_F4(d, 13), MP_F4(d, 14),
        MP_F4(d, 15), MP_F4(d, 16), MP_F4(d, 17), MP_F4(d, 18), MP_F4(d, 19), MP_F4(d, 20), MP_F4(d, 21),
        MP_F4(d, 22), MP_F4(d, 23), MP_F4(d, 24), MP_F4(d, 25), MP_F4(d, 26), MP_F4(d, 27), MP_F4(d, 28),
        MP_F4(d, 29), MP_F4(d, 30), MP_F4(d, 31)
      : "l"(desc_a), "l"(desc_b), "r"(acc));
}
#undef MP_F4
template <int J>
__device__ __forceinline__ void mp_wgmma(float (&d)[J][4], u64 da, u64 db, int acc) {
  if constexpr (J == 2)
    mp_wgmma_n16(d, da, db, acc);
  else if constexpr (J == 4)
    wgmma_ss_m64n32k16(d, da, db, acc);
  else if constexpr (J == 8)
    wgmma_ss_m64n64k16(d, da, db, acc);
  else if constexpr (J == 16)
    mp_wgmma_n128(d, da, db, acc);
  else
    mp_wgmma_n256(d, da, db, acc);
}

template <int J, int MODE>
__device__ __forceinline__ void mma_run(int stages, unsigned long long* cycles, unsigned* wrong) {
  constexpr int KC = 128, R = 64, NX = 8 * J, kW = R * KC * 2, kStage = kW + NX * KC * 2;
  extern __shared__ __align__(128) unsigned char mp_smem[];
  const int tid = threadIdx.x;
  const u32 base = (smem_u32(mp_smem) + 1023u) & ~1023u;
  unsigned char* p = mp_smem + (base - smem_u32(mp_smem));
  for (int e = tid * 16; e < stages * kStage; e += 128 * 16)
    *reinterpret_cast<uint4*>(p + e) = make_uint4(0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u);
  fence_proxy_async_smem();  // the generic proxy's stores, seen by the wgmmas' async proxy
  __syncthreads();
  float acc[J][4], acc_odd[J][4];
  const long long c0 = clock64();
  for (int s = 0; s < stages; ++s) {
    const u32 st = base + (u32)(s * kStage);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KC / 16; ++kk) {
      const u32 off = (u32)(kk >> 2) * 128u, step = (u32)(kk & 3) * 32u;
      const u64 db = wg_desc_sw128(st + kW + off * NX + step, 16, 1024);
      const u64 da = wg_desc_sw128(st + off * R + step, 16, 1024);
      if (MODE == 2 && (kk & 1))
        mp_wgmma<J>(acc_odd, da, db, s > 0 || kk > 1);
      else
        mp_wgmma<J>(acc, da, db, s > 0 || kk > 0);
    }
    wg_commit();
    if (MODE == 3)
      wg_wait<0>();
    else if (MODE != 1)
      wg_wait<1>();
  }
  wg_wait<0>();
  const long long c1 = clock64();
  wg_fence_regs<J>(acc);
  if constexpr (MODE == 2) wg_fence_regs<J>(acc_odd);
  const float want = (float)(stages * KC);
  unsigned bad = 0;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) bad += (MODE == 2 ? acc[j][e] + acc_odd[j][e] : acc[j][e]) != want;
  atomicAdd(wrong + blockIdx.x, bad);
  if (tid == 0) cycles[blockIdx.x] = (unsigned long long)(c1 - c0);
}
#define MMA_BODY(J, MODE) mma_run<J, MODE>(stages, cycles, wrong)
#else
#define MMA_BODY(J, MODE) __trap()  // wgmma needs the sm_90a build (probe_mma.py builds it so)
#endif

#define MMA_KERNEL(name, J, MODE)                                                                         \
  extern "C" __global__ void __launch_bounds__(128) name(int stages, unsigned long long* cycles,       \
                                                         unsigned* wrong) {                            \
    MMA_BODY(J, MODE);                                                                                 \
  }
MMA_KERNEL(mma_n16_engine, 2, 0)
MMA_KERNEL(mma_n16_free, 2, 1)
MMA_KERNEL(mma_n32_engine, 4, 0)
MMA_KERNEL(mma_n32_free, 4, 1)
MMA_KERNEL(mma_n32_chains, 4, 2)
MMA_KERNEL(mma_n32_wait0, 4, 3)
MMA_KERNEL(mma_n64_engine, 8, 0)
MMA_KERNEL(mma_n64_free, 8, 1)
MMA_KERNEL(mma_n64_chains, 8, 2)
MMA_KERNEL(mma_n64_wait0, 8, 3)
MMA_KERNEL(mma_n128_engine, 16, 0)
MMA_KERNEL(mma_n128_free, 16, 1)
MMA_KERNEL(mma_n256_engine, 32, 0)
MMA_KERNEL(mma_n256_free, 32, 1)
