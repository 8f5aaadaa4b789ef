// gemm.cu -- y = x W^T on tensor cores with a reduction order that depends on K only: the GEMM of
// batch-invariant mode.
//
// Reference twin: reference/model.py, linear(x, w, batch_invariant=True) (one vector-matrix product
// per row, so a row's result never depends on how many rows share the call).
//
// Layouts: x bf16 [M, K] (row stride ldx elements, K contiguous), W bf16 [N, K] contiguous (a torch
// Linear weight), y [M, N] contiguous, bf16 or fp32. K % 8 == 0 and N % 2 == 0 (16-byte loads,
// paired stores); the host checks both.
//
// The invariance argument. Every output element is produced the same way by every kernel below:
//   acc = 0 (fp32);  for k0 = 0, 16, 32, ... < K in increasing order:  acc = mma(x[m, k0:k0+16], W[n, k0:k0+16], acc)
// with one m16n8k16 tensor-core instruction per step (columns past K are zero-filled, and steps
// entirely past K are skipped, not multiplied by zeros). The instruction's internal order is fixed
// by the hardware, and an element's inputs are its own row of x and column of W^T -- never another
// row's. The CTA tile (BM x BN), the K tile per pipeline stage (BK) and the warp layout only decide
// *where* an element is computed, not *how*: so the kernel is chosen by M for speed (small tiles
// and many CTAs for decode, large tiles for prefill) without changing any bit of any row. There is
// no split-K and no atomics.
//
// Structure: 32*WM*WN threads; warps in a WM x WN grid, each owning (BM/WM) x (BN/WN) outputs as
// MT x NT tiles of 16 x 8; STAGES-deep cp.async pipeline of BK-wide tiles of x and W in shared
// memory (rows padded by 8 bf16 so that ldmatrix phases hit distinct bank groups); fragments by
// ldmatrix.x4 in the layouts documented in attention.cu.

#include <cuda_bf16.h>

#include "mma.cuh"

namespace {

template <int BM, int BN, int WM, int WN, int BK, int STAGES>
struct GemmCfg {
  static constexpr int THREADS = 32 * WM * WN;
  static constexpr int LDS = BK + 8;                                   // padded smem row (bf16)
  static constexpr int MT = BM / WM / 16, NT = BN / WN / 8;            // mma tiles per warp
  static constexpr int STAGE = (BM + BN) * LDS;                        // bf16 per stage: x then W
  static_assert(BM % (WM * 16) == 0 && BN % (WN * 16) == 0, "warp tiles are whole 16 x 16 blocks");
  static_assert(BK % 16 == 0 && STAGES >= 2, "BK a multiple of 16, at least double buffering");
};

// cp.async one BK-wide stage: x rows [m0, m0 + BM), W rows [n0, n0 + BN), columns [k0, k0 + BK).
// Chunks outside [0, M) x [0, K) or [0, N) x [0, K) are zero-filled (K % 8 == 0: a 16-byte chunk is
// entirely inside or entirely outside).
template <int BM, int BN, int BK, int LDS, int THREADS>
__device__ __forceinline__ void load_stage(__nv_bfloat16* sA, __nv_bfloat16* sB, const __nv_bfloat16* __restrict__ x,
                                           int ldx, const __nv_bfloat16* __restrict__ w, int M, int N, int K, int m0,
                                           int n0, int k0, int tid) {
  constexpr int CH = BK / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = tid; i < BM * CH; i += THREADS) {
    const int r = i / CH, c = i - r * CH;
    const int m = m0 + r, k = k0 + c * 8;
    const bool ok = m < M && k < K;
    cp_async16(smem_u32(sA + r * LDS + c * 8), ok ? x + (long long)m * ldx + k : x, ok);
  }
#pragma unroll
  for (int i = tid; i < BN * CH; i += THREADS) {
    const int r = i / CH, c = i - r * CH;
    const int n = n0 + r, k = k0 + c * 8;
    const bool ok = n < N && k < K;
    cp_async16(smem_u32(sB + r * LDS + c * 8), ok ? w + (long long)n * K + k : w, ok);
  }
}

template <int BM, int BN, int WM, int WN, int BK, int STAGES, bool F32>
__device__ __forceinline__ void gemm_impl(const __nv_bfloat16* __restrict__ x, int ldx,
                                          const __nv_bfloat16* __restrict__ w, void* __restrict__ y, int M, int N,
                                          int K) {
  typedef GemmCfg<BM, BN, WM, WN, BK, STAGES> C;
  constexpr int THREADS = C::THREADS, LDS = C::LDS, MT = C::MT, NT = C::NT, STAGE = C::STAGE;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // stage s: x at s*STAGE, W after BM rows

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WN, wn = warp - wm * WN;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int KT = (K + BK - 1) / BK;

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT)
      load_stage<BM, BN, BK, LDS, THREADS>(smem + s * STAGE, smem + s * STAGE + BM * LDS, x, ldx, w, M, N, K, m0, n0,
                                          s * BK, tid);
    cp_async_commit();
  }

  const int mi = lane >> 3;
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();  // stage kt has landed (this thread's copies) ...
    __syncthreads();              // ... for every thread; and stage kt-1 is no longer read
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) {
        const int st = nk % STAGES;
        load_stage<BM, BN, BK, LDS, THREADS>(smem + st * STAGE, smem + st * STAGE + BM * LDS, x, ldx, w, M, N, K, m0,
                                            n0, nk * BK, tid);
      }
      cp_async_commit();
    }
    const __nv_bfloat16* sA = smem + (kt % STAGES) * STAGE;
    const __nv_bfloat16* sB = sA + BM * LDS;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      if (kt * BK + kk * 16 >= K) break;  // steps past K are skipped (uniform), never multiplied by zeros
      u32 a[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int row = wm * (BM / WM) + i * 16 + ((mi & 1) << 3) + (lane & 7);
        const int col = kk * 16 + ((mi >> 1) << 3);
        ldsm_x4(a[i][0], a[i][1], a[i][2], a[i][3], smem_u32(sA + row * LDS + col));
      }
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        // matrices: (n j*8+0..7, k +0..7), (same n, k +8), (n +8, k +0), (n +8, k +8)
        const int n = wn * (BN / WN) + j * 8 + ((mi >> 1) << 3) + (lane & 7);
        const int col = kk * 16 + ((mi & 1) << 3);
        u32 b0, b1, b2, b3;
        ldsm_x4(b0, b1, b2, b3, smem_u32(sB + n * LDS + col));
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          mma_bf16(acc[i][j], a[i], b0, b1);
          mma_bf16(acc[i][j + 1], a[i], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: c0, c1 at (row g, cols 2t, 2t+1), c2, c3 at (row g + 8, same cols); N even, so a pair
  // is entirely inside or outside.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int n = n0 + wn * (BN / WN) + j * 8 + 2 * t;
      if (n >= N) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + wm * (BM / WM) + i * 16 + g + 8 * h;
        if (m >= M) continue;
        const long long off = (long long)m * N + n;
        if constexpr (F32) {
          *reinterpret_cast<float2*>(reinterpret_cast<float*>(y) + off) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(y) + off) =
              __floats2bfloat162_rn(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
  }
}

}  // namespace

// Instantiations: gemm_<BM>x<BN>_{bf16,f32}. ops.py picks one by M and computes the same shared
// memory (STAGES * (BM + BN) * (BK + 8) * 2 bytes) and thread count (32 * WM * WN).
#define TK_GEMM(NAME, BM, BN, WM, WN, BK, STAGES, F32, OUT_T)                                                      \
  extern "C" __global__ void __launch_bounds__(32 * WM * WN) NAME(const __nv_bfloat16* __restrict__ x, int ldx,    \
                                                                 const __nv_bfloat16* __restrict__ w,              \
                                                                 OUT_T* __restrict__ y, int M, int N, int K) {     \
    gemm_impl<BM, BN, WM, WN, BK, STAGES, F32>(x, ldx, w, y, M, N, K);                                           \
  }
#define TK_GEMM2(TAG, BM, BN, WM, WN, BK, STAGES)                               \
  TK_GEMM(gemm_##TAG##_bf16, BM, BN, WM, WN, BK, STAGES, false, __nv_bfloat16) \
  TK_GEMM(gemm_##TAG##_f32, BM, BN, WM, WN, BK, STAGES, true, float)

TK_GEMM2(16x32, 16, 32, 1, 2, 128, 4)    // M <= 16: decode; 64 threads, narrow N tiles -> many CTAs
TK_GEMM2(32x32, 32, 32, 2, 1, 128, 4)    // M <= 32
TK_GEMM2(64x32, 64, 32, 4, 1, 64, 4)     // M <= 64
TK_GEMM2(64x64, 64, 64, 2, 2, 64, 4)     // M <= 256
TK_GEMM2(128x128, 128, 128, 2, 2, 32, 4) // prefill
