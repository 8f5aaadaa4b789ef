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
// The canonical order. K is cut into chunks of KC = 512 columns (the last one may be shorter).
// For every output element y[m, n]:
//   p_c = 0;  for k0 = c*KC, c*KC + 16, ... (inside chunk c, increasing):  p_c = mma(x[m, k0:k0+16], W[n, k0:k0+16], p_c)
//   t = 0;    for c = 0, 1, ... (increasing):  t = t + p_c      (fp32, round to nearest, no contraction)
//   y[m, n] = t (rounded to bf16 for a bf16 output)
// with one m16n8k16 tensor-core instruction per step (columns past K are zero-filled; steps entirely
// past K are skipped, not multiplied by zeros). The instruction's internal order is fixed by the
// hardware, and an element's inputs are its own row of x and column of W^T -- never another row's.
//
// Two kernels implement that order, and ops.py may pick either, with any tile, for any M -- the choice
// changes the speed, never a bit:
//   gemm_<tile>_{bf16,f32}        one CTA per output tile walks all of K, folding each chunk's
//                                 accumulator into the total at the chunk's end (registers only);
//   gemm_split_<tile>_{bf16,f32}  one CTA per (output tile, chunk) -- K-parallel, for the few rows of a
//                                 decode step -- writes p_c (fp32) to a workspace; the last CTA of a
//                                 tile to finish (an atomic ticket per tile) folds p_0, p_1, ... in
//                                 chunk order and writes y, then resets the ticket for the next launch.
// There are no atomics on data and no dependence on which CTA finishes last.
// Two more, for the rows of a decode step, stream the weights through shared memory over a persistent grid:
//   gemm_staged_m{R}_s{S}c{CPS}_{bf16,f32}  a producer warp bulk-copies CPS chunks of a tile's 16 weight rows
//                                 and of the (at most R) x rows into one of S stages, and consumer warp
//                                 i % 4 walks stage i in canonical order (below, "The staged kernel");
//   gemm_wide_m{R}_n{TW}_k{KS}s{S}{,w8,w16}_{bf16,f32,swiglu}  a producer lane fills each stage -- a KS-column slice
//                                 of a TW-row weight tile and of R x rows -- by two tensor copies, and each
//                                 consumer warp walks its own outputs through every stage in canonical
//                                 order (below, "The wide kernel").
//
// Structure: 32*WM*WN threads; warps in a WM x WN grid, each owning (BM/WM) x (BN/WN) outputs as
// MT x NT tiles of 16 x 8; STAGES-deep cp.async pipeline of BK-wide tiles of x and W in shared
// memory (rows padded by 8 bf16 so that ldmatrix phases hit distinct bank groups); fragments by
// ldmatrix.x4 in the layouts documented in attention.cu.

#include <cuda_bf16.h>

#include "pdl.cuh"

#include "mma.cuh"
#include "swiglu.cuh"
#include "tma.cuh"

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
// entirely inside or entirely outside). The 16-row tiles of decode steps, which stream the weights,
// copy through L1 (.ca); the others bypass it (.cg): mma.cuh has the measurements.
template <int BM, int BN, int BK, int LDS, int THREADS>
__device__ __forceinline__ void load_stage(__nv_bfloat16* sA, __nv_bfloat16* sB, const __nv_bfloat16* __restrict__ x,
                                           int ldx, const __nv_bfloat16* __restrict__ w, int M, int N, int K, int m0,
                                           int n0, int k0, int tid) {
  constexpr int CH = BK / 8;  // 16-byte chunks per row
  constexpr bool L1 = BM <= 16;
#pragma unroll
  for (int i = tid; i < BM * CH; i += THREADS) {
    const int r = i / CH, c = i - r * CH;
    const int m = m0 + r, k = k0 + c * 8;
    const bool ok = m < M && k < K;
    cp_async16<L1>(smem_u32(sA + r * LDS + c * 8), ok ? x + (long long)m * ldx + k : x, ok);
  }
#pragma unroll
  for (int i = tid; i < BN * CH; i += THREADS) {
    const int r = i / CH, c = i - r * CH;
    const int n = n0 + r, k = k0 + c * 8;
    const bool ok = n < N && k < K;
    cp_async16<L1>(smem_u32(sB + r * LDS + c * 8), ok ? w + (long long)n * K + k : w, ok);
  }
}

constexpr int KC = 512;  // chunk of the canonical order (ops.py: GEMM_CHUNK); every BK divides it

// y[off], y[off + 1] = a, b: fp32, or rounded to bf16 (off even: one 8- or 4-byte store)
template <bool F32>
__device__ __forceinline__ void store_pair(void* __restrict__ y, long long off, float a, float b) {
  if constexpr (F32)
    *reinterpret_cast<float2*>(reinterpret_cast<float*>(y) + off) = make_float2(a, b);
  else
    *reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(y) + off) = __floats2bfloat162_rn(a, b);
}

// A warp's MT x NT C fragments: p_c = t = 0 at a tile's start, and the canonical order's fold at a chunk's end,
// t = t + p_c (one rounding, no contraction) and p_c = 0.
template <int MT, int NT>
__device__ __forceinline__ void frags_zero(float (&acc)[MT][NT][4], float (&tot)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = tot[i][j][e] = 0.f;
}
template <int MT, int NT>
__device__ __forceinline__ void frags_fold(float (&tot)[MT][NT][4], float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        tot[i][j][e] = __fadd_rn(tot[i][j][e], acc[i][j][e]);
        acc[i][j][e] = 0.f;
      }
}

// Stores the fp32 values v (c0..c3 layout) of this warp's tiles: to y (bf16 or fp32) or to a workspace.
template <int BM, int BN, int WM, int WN, int MT, int NT, bool F32>
__device__ __forceinline__ void store_tiles(const float (&v)[MT][NT][4], void* __restrict__ y, int M, int N, int m0,
                                            int n0, int wm, int wn, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int n = n0 + wn * (BN / WN) + j * 8 + 2 * t;
      if (n >= N) continue;  // N even: a pair is entirely inside or outside
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + wm * (BM / WM) + i * 16 + g + 8 * h;
        if (m >= M) continue;
        store_pair<F32>(y, (long long)m * N + n, v[i][j][2 * h], v[i][j][2 * h + 1]);
      }
    }
  }
}

// The main loop over k in [k_begin, k_end) (k_begin a multiple of KC). FOLD: acc is folded into
// total at every chunk end and zeroed (total holds the result); otherwise acc holds the one chunk's p_c.
template <int BM, int BN, int WM, int WN, int BK, int STAGES, bool FOLD>
__device__ __forceinline__ void gemm_mainloop(const __nv_bfloat16* __restrict__ x, int ldx,
                                              const __nv_bfloat16* __restrict__ w, int M, int N, int K, int m0, int n0,
                                              int k_begin, int k_end,
                                              float (&acc)[GemmCfg<BM, BN, WM, WN, BK, STAGES>::MT]
                                                          [GemmCfg<BM, BN, WM, WN, BK, STAGES>::NT][4],
                                              float (&total)[GemmCfg<BM, BN, WM, WN, BK, STAGES>::MT]
                                                            [GemmCfg<BM, BN, WM, WN, BK, STAGES>::NT][4]) {
  typedef GemmCfg<BM, BN, WM, WN, BK, STAGES> C;
  constexpr int THREADS = C::THREADS, LDS = C::LDS, MT = C::MT, NT = C::NT, STAGE = C::STAGE;
  static_assert(KC % BK == 0, "a chunk is a whole number of K tiles");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // stage s: x at s*STAGE, W after BM rows
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WN, wn = warp - wm * WN;
  const int KT = (k_end - k_begin + BK - 1) / BK;

  frags_zero(acc, total);

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT)
      load_stage<BM, BN, BK, LDS, THREADS>(smem + s * STAGE, smem + s * STAGE + BM * LDS, x, ldx, w, M, N, K, m0, n0,
                                          k_begin + s * BK, tid);
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
                                            n0, k_begin + nk * BK, tid);
      }
      cp_async_commit();
    }
    const __nv_bfloat16* sA = smem + (kt % STAGES) * STAGE;
    const __nv_bfloat16* sB = sA + BM * LDS;
    const int kbase = k_begin + kt * BK;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      if (kbase + kk * 16 >= k_end) break;  // steps past K are skipped (uniform), never multiplied by zeros
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
    if constexpr (FOLD) {
      if ((kbase + BK) % KC == 0 || kt == KT - 1) frags_fold(total, acc);  // chunk end: total += p_c, p_c = 0
    }
  }
  cp_async_wait<0>();
}

// One CTA per output tile over all of K (chunk folds in registers).
template <int BM, int BN, int WM, int WN, int BK, int STAGES, bool F32>
__device__ __forceinline__ void gemm_impl(const __nv_bfloat16* __restrict__ x, int ldx,
                                          const __nv_bfloat16* __restrict__ w, void* __restrict__ y, int M, int N,
                                          int K) {
  typedef GemmCfg<BM, BN, WM, WN, BK, STAGES> C;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / WN, wn = warp - wm * WN;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  float acc[C::MT][C::NT][4], total[C::MT][C::NT][4];
  gemm_mainloop<BM, BN, WM, WN, BK, STAGES, true>(x, ldx, w, M, N, K, m0, n0, 0, K, acc, total);
  store_tiles<BM, BN, WM, WN, C::MT, C::NT, F32>(total, y, M, N, m0, n0, wm, wn, lane);
}

// One CTA per (output tile, chunk): p_c to the workspace ws [chunks, M, N] (fp32); the tile's last CTA
// (ticket) folds the chunks in order into y and resets the ticket to 0.
template <int BM, int BN, int WM, int WN, int BK, int STAGES, bool F32>
__device__ __forceinline__ void gemm_split_impl(const __nv_bfloat16* __restrict__ x, int ldx,
                                                const __nv_bfloat16* __restrict__ w, void* __restrict__ y,
                                                float* __restrict__ ws, int* __restrict__ tickets, int M, int N,
                                                int K) {
  typedef GemmCfg<BM, BN, WM, WN, BK, STAGES> C;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WN, wn = warp - wm * WN;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, c = blockIdx.z;
  const int chunks = gridDim.z;
  float acc[C::MT][C::NT][4], total[C::MT][C::NT][4];
  gemm_mainloop<BM, BN, WM, WN, BK, STAGES, false>(x, ldx, w, M, N, K, m0, n0, c * KC, min(K, (c + 1) * KC), acc,
                                                   total);
  const long long MN = (long long)M * N;
  store_tiles<BM, BN, WM, WN, C::MT, C::NT, true>(acc, ws + c * MN, M, N, m0, n0, wm, wn, lane);
  __threadfence();  // this CTA's partials are visible device-wide before its ticket is taken
  __syncthreads();
  __shared__ int s_last;
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  if (tid == 0) s_last = atomicAdd(tickets + tile, 1) == chunks - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // fold: t = 0; t = t + p_c for c = 0, 1, ... -- the registers of gemm_impl, element by element
  for (int i = tid; i < BM * (BN / 2); i += C::THREADS) {
    const int r = i / (BN / 2), n = n0 + 2 * (i - r * (BN / 2));
    const int m = m0 + r;
    if (m >= M || n >= N) continue;
    const long long off = (long long)m * N + n;
    float t0 = 0.f, t1 = 0.f;
    for (int cc = 0; cc < chunks; ++cc) {
      const float2 p = __ldcg(reinterpret_cast<const float2*>(ws + cc * MN + off));  // L2: written by other SMs
      t0 = __fadd_rn(t0, p.x);
      t1 = __fadd_rn(t1, p.y);
    }
    store_pair<F32>(y, off, t0, t1);
  }
  if (tid == 0) tickets[tile] = 0;  // ready for the next launch (kernels on one stream run in order)
}

// ---- The staged kernel (gemm_staged_*): decode rows, the weights through shared memory ----
//
// Why: the split tiles above load both operands with cp.async from every CTA of a (64 columns, chunk) grid and
// fold through a global workspace; at M <= 16 they stream the weights at about 2.5 TB/s, where the default
// mode's staged skinny kernel (skinny_gemm.cu) reaches about 4. This kernel takes that one's data movement and
// keeps this file's order:
//   * work: the 16-row tiles of W, whole; CTA b takes tiles b, b + G, b + 2G, .. (G CTAs). Stage i (a CTA's i-th
//     (tile, group of CPS chunks) pair, the groups of a tile in order) holds those CPS chunks of the tile's 16
//     weight rows and of the first min(M, R) rows of x (R = 8, 16 or 32), rows gs_rs(CPS) bytes apart;
//   * warp 4 produces: it waits for a stage to be empty, announces its bytes on its "full" barrier, and its
//     lanes issue one bulk copy per row (weights at L2 evict-first priority, x without a hint). A copy carries
//     CPS chunks: on the H200, with one copy per row and chunk (CPS = 1), a CTA of 8 stages streamed no faster
//     than one of 4 while two CTAs a multiprocessor did, which points to the producer's copies rather than the
//     bytes in flight; with two chunks a copy one CTA of 4 stages ran as fast as the two (docs/performance/batch_invariant.md,
//     "The staged kernel of the batch-invariant GEMM");
//   * every consumer warp waits for every stage in order and arrives on its "empty" barrier, and warp i % 4
//     computes stage i: for each of its chunks c, x as the A operand (ldmatrix.x4, rows g and g + 8 of each 16)
//     and the weight rows as two n8 B tiles (ldmatrix.x4), one mma.m16n8k16 per 16 columns and B tile from a
//     zero accumulator, in increasing k -- p_c exactly as gemm_mainloop computes it (the same instruction, the
//     same operands in the same roles; the upper 8 columns of a last step past K are zeroed in both operands,
//     as the copies above zero-fill them; steps past K are not issued);
//   * the fold: t = t + p_c in chunk order, as above. The consumer of stage i waits until stage i - 1's has
//     added its chunks (a counter in shared memory, `done`), adds its own in order to the tile's running total
//     (t = 0 + p_0 at chunk 0), and at the tile's last stage stores t instead.
// So every element is the canonical order's, bit for bit, whatever R, S, CPS, the grid and M (check_kernels.py,
// "gemm": every tile against every other). Rows of x past M and of W past N are never copied: their lanes of
// the fragments hold stale shared memory, which reaches only outputs that are not stored (an element reads
// its own row of x and column of W^T only).
constexpr int kGsCW = 4;  // consumer warps; warp kGsCW is the producer
// bytes from row to row of a stage of CPS chunks: 16 (mod 128) past 128-byte lines, so that the 8 rows of an
// ldmatrix phase fall on distinct banks
__host__ __device__ constexpr int gs_rs(int cps) { return cps * KC * 2 + 16; }

template <int R, int S, int CPS, bool F32>
__device__ __forceinline__ void gemm_staged_impl(const __nv_bfloat16* __restrict__ x, int ldx,
                                                 const __nv_bfloat16* __restrict__ w, void* __restrict__ y, int M,
                                                 int N, int K) {
  constexpr int MT = R >= 16 ? R / 16 : 1;  // 16-row A tiles of x
  constexpr int kRS = gs_rs(CPS), kStage = (R + 16) * kRS;  // x rows, then the 16 weight rows
  static_assert(S >= 2 && (CPS == 1 || CPS == 2 || CPS == 4) && (R == 8 || R == 16 || R == 32), "staged gemm");
  extern __shared__ __align__(128) unsigned char gs_smem[];  // S stages
  __shared__ __align__(8) u64 bars[2 * S];                   // full[s], then empty[s]
  __shared__ float tot[MT][2][4][32];                        // the tile's running total, fragment-major
  __shared__ int done;                                       // stages folded so far
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tiles = (N + 15) >> 4, kst = (K + CPS * KC - 1) / (CPS * KC);  // stages of a tile
  const u32 base = smem_u32(gs_smem), bar_full = smem_u32(bars), bar_empty = bar_full + 8 * S;
  if (tid == 0) {
    mbar_init_stages<S>(bar_full, bar_empty, kGsCW);
    done = 0;
    mbar_fence_init();
  }
  __syncthreads();

  if (warp == kGsCW) {  // ---- producer
    const u64 policy = l2_evict_first();
    const int xrows = min(M, R);
    int i = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int wrows = min(16, N - 16 * t);
      for (int ks = 0; ks < kst; ++ks, ++i) {
        const int s = i % S;
        if (i >= S) mbar_wait(bar_empty + 8 * s, (u32)((i / S) + 1) & 1u);  // its previous use consumed
        const int k0 = ks * CPS * KC;
        const u32 bytes = (u32)min(CPS * KC, K - k0) * 2u;
        if (lane == 0) mbar_expect_tx(bar_full + 8 * s, bytes * (u32)(xrows + wrows));
        __syncwarp();  // the bytes are announced before any copy lands
        const u32 st = base + s * kStage;
        for (int r = lane; r < R + 16; r += 32) {
          if (r < R) {
            if (r < xrows) bulk_copy(st + r * kRS, x + (long long)r * ldx + k0, bytes, bar_full + 8 * s);
          } else if (r - R < wrows) {
            bulk_copy_hint(st + r * kRS, w + (long long)(16 * t + r - R) * K + k0, bytes, bar_full + 8 * s, policy);
          }
        }
      }
    }
    return;
  }

  // ---- consumers
  const int mi = lane >> 3, g = lane >> 2, t4 = lane & 3;
  int i = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    for (int ks = 0; ks < kst; ++ks, ++i) {
      const int s = i % S;
      mbar_wait(bar_full + 8 * s, (u32)(i / S) & 1u);
      if (i % kGsCW != warp) {  // not this warp's stage: its arrival frees it as far as this warp goes
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty + 8 * s);
        continue;
      }
      const int cols = min(CPS * KC, K - ks * CPS * KC);
      const u32 sx = base + s * kStage, sw = sx + R * kRS;
      float acc[CPS][MT][2][4];
#pragma unroll
      for (int q = 0; q < CPS; ++q)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < 2; ++j) acc[q][mt][j][0] = acc[q][mt][j][1] = acc[q][mt][j][2] = acc[q][mt][j][3] = 0.f;
#pragma unroll
      for (int q = 0; q < CPS; ++q) {  // chunk q of the stage: p_q from a zero accumulator
        const int qc = min(KC, cols - q * KC), steps = qc > 0 ? (qc + 15) >> 4 : 0;
#pragma unroll 8
        for (int kk = 0; kk < steps; ++kk) {
          const int col = q * KC + kk * 16;
          u32 a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {  // matrices: (rows +0, k +0), (rows +8, k +0), (rows +0, k +8), (rows +8, k +8)
            int row = mt * 16 + ((mi & 1) << 3) + (lane & 7);
            if (R == 8) row &= 7;  // rows 8-15 of the A tile repeat rows 0-7 (never stored: M <= 8)
            ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], sx + row * kRS + (col + ((mi >> 1) << 3)) * 2);
          }
          // matrices: (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8)
          u32 b0, b1, b2, b3;
          ldsm_x4(b0, b1, b2, b3, sw + (((mi >> 1) << 3) + (lane & 7)) * kRS + (col + ((mi & 1) << 3)) * 2);
          if (kk * 16 + 16 > qc) {  // a last step of 8 columns (K % 16 == 8): the upper 8 are zeros
            b1 = b3 = 0u;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) a[mt][2] = a[mt][3] = 0u;
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(acc[q][mt][0], a[mt], b0, b1);
            mma_bf16(acc[q][mt][1], a[mt], b2, b3);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + 8 * s);  // the stage may be refilled

      // the fold, in stage order: t = t + p_c for the stage's chunks in order (t = 0 + p_0 at the tile's first)
      while (*reinterpret_cast<volatile int*>(&done) != i) {
      }
      __threadfence_block();
      const bool last = ks == kst - 1;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float v[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            v[c] = ks == 0 ? 0.f : tot[mt][j][c][lane];
#pragma unroll
            for (int q = 0; q < CPS; ++q)
              if (q * KC < cols) v[c] = __fadd_rn(v[c], acc[q][mt][j][c]);
            if (!last) tot[mt][j][c][lane] = v[c];
          }
          if (last) {  // c0, c1: x row g, weight rows n, n + 1; c2, c3: x row g + 8
            const int n = 16 * t + 8 * j + 2 * t4;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int m = mt * 16 + g + 8 * h;
              if (m >= M || n >= N) continue;  // N even: a pair is entirely inside or outside
              store_pair<F32>(y, (long long)m * N + n, v[2 * h], v[2 * h + 1]);
            }
          }
        }
      __syncwarp();
      if (lane == 0) {
        __threadfence_block();
        *reinterpret_cast<volatile int*>(&done) = i + 1;
      }
    }
  }
}

// ---- The wide kernel (gemm_wide_*): decode rows up to 128, wide weight tiles by tensor copies ----
//
// Why: the staged kernel's producer copies every x row of a stage beside 16 weight rows, one bulk copy a row (~45 ns
// each, whatever its size: skinny_gemm.cu's cluster kernel); above 8 rows at the 8B shapes it lost to the split
// tiles, which themselves stream the weights at 1.2-1.7 TB/s at 17-64 rows. This kernel copies a stage by two tensor
// copies and shares each copy of x among TW weight rows (docs/performance/batch_invariant.md, "The wide kernel of the
// batch-invariant GEMM": from 1 row on, level with cuBLAS or faster up to 32 rows of the qwen3 GEMMs):
//   * work: the TW-row tiles of W (TW = 32 or 64), whole; CTA b takes tiles b, b + G, .. (G CTAs). A tile's
//     stages are its KS-column slices in order (KS = 128, 256 or 512, so a chunk is KC / KS stages); stage i holds
//     the slice of the tile's TW weight rows, then of the first R rows of x, each as ops.py's "block" tensor maps
//     land them: block after 64-column block, a block's rows 128 bytes apart, 128-byte swizzled (swz128). Rows
//     past N or M arrive as zeros and are never stored; K % 64 == 0 (ops.py checks it), so a stage is whole
//     blocks and blocks past K are not multiplied;
//   * warp CW's lane 0 produces: waits for a stage to be empty, announces its bytes, issues the two copies
//     (weights at L2 evict-first priority). The weight copies of its first `pre` stages go out before its PDL wait
//     (weights are written by no kernel), their x copies after it; the consumers wait before anything else. With
//     `trigger` == 0 no thread calls griddepcontrol.launch_dependents, so the next kernel is scheduled only as
//     this grid's CTAs exit (ops.py: the SwiGLU launches of few rows, whose successor is the down GEMM);
//   * the CW consumer warps (4, 8 or 16), a WM x WN grid over the stage's R x TW outputs (WM = min(R / 16,
//     CW / 2)), all take every stage: each computes its own outputs' p_c over the stage's blocks with
//     mma.m16n8k16 -- x as the A operand (ldmatrix.x4), the weight rows as pairs of n8 B tiles (ldmatrix.x4), the
//     operands in the roles of gemm_mainloop -- accumulating in increasing k from zero at each chunk's first
//     stage, and at each chunk's last stage folds t = t + p_c in registers (t = 0 at the tile's start), storing t
//     after the tile's last.
//     The fold needs no other warp: an element's chunks all pass through one warp, in order.
// The SwiGLU build (SW, bf16 out [M, N = I]) takes W = [gate | up] [2I, K] through launch.encode_swiglu_map's 5-D
// map: a TW-row box lands each block's rows as 8 gate rows, the 8 up rows of the same outputs, and so on, so a
// warp's n8 tiles j, j + 1 (j even) are gate and up of the same 8 output columns, and the consumers above are
// unchanged. A tile covers TW / 2 outputs; its store is silu_mul1(bf16(gate), bf16(up)) rounded to bf16, the very
// bits of silu_mul after the plain GEMM (check_kernels.py, "gemm_swiglu").
// So every element is the canonical order's, bit for bit (check_kernels.py, "gemm"). A warp whose rows are all
// past M skips the multiplies and only releases the stages. (Measured and dropped: thread-block clusters whose CTAs
// each copy a slice of x into all of them by multicast, slower at 45 of 50 probe points.)
template <int R, int TW, int KS, int S, int CW, bool F32, bool SW>
__device__ __forceinline__ void gemm_wide_impl(const TensorMap* wmap, const TensorMap* xmap, void* __restrict__ y,
                                               int M, int N, int K, int pre, int trigger) {
  constexpr int NB = KS / 64;                                     // 64-column blocks a stage
  constexpr int WM = R / 16 < CW / 2 ? R / 16 : CW / 2, WN = CW / WM;  // the consumer warps' grid
  constexpr int MT = R / 16 / WM, NT = TW / 8 / WN;               // 16-row A tiles and n8 B tiles a warp
  constexpr int kW = NB * TW * 128, kStage = kW + NB * R * 128, SPC = KC / KS;  // bytes; stages a chunk
  static_assert(KC % KS == 0 && KS % 64 == 0 && MT >= 1 && NT >= 2 && NT % 2 == 0 && S >= 2 && WM * WN == CW &&
                    (CW == 4 || CW == 8 || CW == 16) && !(SW && F32),
                "wide gemm");
  static_assert(kW % 1024 == 0 && kStage % 1024 == 0, "every box 1024-byte aligned (the swizzle's period)");
  extern __shared__ __align__(128) unsigned char gw_smem[];  // up to 1 KB of slack (aligned below), then S stages
  __shared__ __align__(8) u64 bars[2 * S];                   // full[s], then empty[s]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int outs = SW ? TW / 2 : TW;                              // output columns of a tile
  const int tiles = (N + outs - 1) / outs, kst = (K + KS - 1) / KS;  // stages of a tile
  const u32 base = (smem_u32(gw_smem) + 1023u) & ~1023u;
  const u32 bar_full = smem_u32(bars), bar_empty = bar_full + 8 * S;
  if (warp == CW && lane == 0) {  // the maps are kernel parameters: no kernel writes them
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(wmap)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(xmap)) : "memory");
  }
  if (tid == 0) {
    mbar_init_stages<S>(bar_full, bar_empty, CW);
    mbar_fence_init();
  }
  __syncthreads();

  if (warp == CW) {  // ---- producer: lane 0
    if (lane == 0) {
      const u64 policy = l2_evict_first();
      const int total = ((tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1) * kst;  // this CTA's stages (host: grid <= tiles)
      const int early = min(min(pre, S), total);
      auto weights = [&](int i) {  // stage i's weight box, and the bytes the stage expects (x's included)
        const int s = i % S, t = (int)blockIdx.x + i / kst * (int)gridDim.x, ks = i % kst;
        mbar_expect_tx(bar_full + 8 * s, (u32)kStage);  // whole boxes: zeros past the edges count too
        if constexpr (SW) {
          tensor_copy5(base + s * kStage, wmap, 0, 0, 0, t * (TW / 16), ks * NB, bar_full + 8 * s, policy, 1);
        } else {
          tensor_copy(base + s * kStage, wmap, 0, t * TW, ks * NB, bar_full + 8 * s, policy, 1);
        }
      };
      for (int i = 0; i < early; ++i) weights(i);  // the weights are written by no kernel
      pdl_wait();                                   // x is the kernel before's output
      if (trigger) pdl_launch_dependents();
      for (int i = 0; i < total; ++i) {
        const int s = i % S;
        if (i >= early) {
          if (i >= S) mbar_wait(bar_empty + 8 * s, (u32)((i / S) + 1) & 1u);  // its previous use consumed
          weights(i);
        }
        tensor_copy(base + s * kStage + kW, xmap, 0, 0, i % kst * NB, bar_full + 8 * s, policy, 0);
      }
    }
    return;
  }

  // ---- consumers
  pdl_wait();
  if (trigger) pdl_launch_dependents();
  const int wm = warp / WN, wn = warp - wm * WN, mi = lane >> 3, g = lane >> 2, t4 = lane & 3;
  const int m_base = wm * MT * 16, n_base = wn * NT * 8;
  float acc[MT][NT][4], tot[MT][NT][4];
  int i = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    frags_zero(acc, tot);
    for (int ks = 0; ks < kst; ++ks, ++i) {
      const int s = i % S;
      mbar_wait(bar_full + 8 * s, (u32)(i / S) & 1u);
      const u32 sw = base + s * kStage, sx = sw + kW;
      const int blocks = min(NB, (K >> 6) - ks * NB);
      if (m_base < M) {
        for (int b = 0; b < blocks; ++b) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {  // matrices: (rows +0, k +0), (rows +8, k +0), (rows +0, k +8), (rows +8, k +8)
              const int row = m_base + mt * 16 + ((mi & 1) << 3) + (lane & 7);
              ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                      sx + swz128((u32)((b * R + row) * 128 + (kk * 16 + ((mi >> 1) << 3)) * 2)));
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {  // matrices: (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8)
              const int n = n_base + j * 8 + ((mi >> 1) << 3) + (lane & 7);
              u32 b0, b1, b2, b3;
              ldsm_x4(b0, b1, b2, b3, sw + swz128((u32)((b * TW + n) * 128 + (kk * 16 + ((mi & 1) << 3)) * 2)));
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                if (m_base + mt * 16 >= M) continue;  // rows all past M: nothing of theirs is stored
                mma_bf16(acc[mt][j], a[mt], b0, b1);
                mma_bf16(acc[mt][j + 1], a[mt], b2, b3);
              }
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + 8 * s);  // the stage may be refilled
      if ((ks + 1) % SPC == 0 || ks == kst - 1) frags_fold(tot, acc);  // a chunk's end: t = t + p_c, p_c = 0
    }
    if constexpr (SW) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; j += 2) {  // tiles j, j + 1: gate and up rows of output columns n .. n + 7
          const int n = t * (TW / 2) + (n_base + j * 8) / 2 + 2 * t4;  // c0, c1: output columns n, n + 1
          if (n >= N) continue;  // N % 8 == 0: a pair is entirely inside or outside
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int m = m_base + mt * 16 + g + 8 * h;
            if (m >= M) continue;
            float v[2];
#pragma unroll
            for (int c = 0; c < 2; ++c)  // silu_mul's bits: of the bf16 gate and up (activation.cu)
              v[c] = silu_mul1(__bfloat162float(__float2bfloat16_rn(tot[mt][j][2 * h + c])),
                               __bfloat162float(__float2bfloat16_rn(tot[mt][j + 1][2 * h + c])));
            store_pair<false>(y, (long long)m * N + n, v[0], v[1]);
          }
        }
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j) {  // c0, c1: x row g, weight rows n, n + 1; c2, c3: x row g + 8
          const int n = t * TW + n_base + j * 8 + 2 * t4;
          if (n >= N) continue;  // N even: a pair is entirely inside or outside
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int m = m_base + mt * 16 + g + 8 * h;
            if (m >= M) continue;
            store_pair<F32>(y, (long long)m * N + n, tot[mt][j][2 * h], tot[mt][j][2 * h + 1]);
          }
        }
    }
  }
}
}  // namespace

// Instantiations. ops.py (GEMM_TILES) picks one by M and computes the same shared memory
// (STAGES * (BM + BN) * (BK + 8) * 2 bytes) and thread count (32 * WM * WN).
#define TK_GEMM(NAME, BM, BN, WM, WN, BK, STAGES, F32, OUT_T)                                                      \
  extern "C" __global__ void __launch_bounds__(32 * WM * WN) NAME(const __nv_bfloat16* __restrict__ x, int ldx,    \
                                                                 const __nv_bfloat16* __restrict__ w,              \
                                                                 OUT_T* __restrict__ y, int M, int N, int K) { pdl_entry(); \
    gemm_impl<BM, BN, WM, WN, BK, STAGES, F32>(x, ldx, w, y, M, N, K);                                           \
  }
#define TK_GEMM_SPLIT(NAME, BM, BN, WM, WN, BK, STAGES, F32, OUT_T)                                                \
  extern "C" __global__ void __launch_bounds__(32 * WM * WN) NAME(                                                 \
      const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w, OUT_T* __restrict__ y,    \
      float* __restrict__ ws, int* __restrict__ tickets, int M, int N, int K) { pdl_entry();                       \
    gemm_split_impl<BM, BN, WM, WN, BK, STAGES, F32>(x, ldx, w, y, ws, tickets, M, N, K);                        \
  }
#define TK_GEMM2(TAG, BM, BN, WM, WN, BK, STAGES)                               \
  TK_GEMM(gemm_##TAG##_bf16, BM, BN, WM, WN, BK, STAGES, false, __nv_bfloat16) \
  TK_GEMM(gemm_##TAG##_f32, BM, BN, WM, WN, BK, STAGES, true, float)
#define TK_GEMM_SPLIT2(TAG, BM, BN, WM, WN, BK, STAGES)                                     \
  TK_GEMM_SPLIT(gemm_split_##TAG##_bf16, BM, BN, WM, WN, BK, STAGES, false, __nv_bfloat16) \
  TK_GEMM_SPLIT(gemm_split_##TAG##_f32, BM, BN, WM, WN, BK, STAGES, true, float)

TK_GEMM2(16x32, 16, 32, 1, 2, 128, 4)    // M <= 16 when N is too large for a workspace (the LM head)
TK_GEMM2(64x64, 64, 64, 2, 2, 64, 4)     // M <= 256
TK_GEMM2(128x64, 128, 64, 2, 2, 32, 4)   // prefill
TK_GEMM_SPLIT2(16x64, 16, 64, 1, 4, 128, 4)  // decode, M <= 16: one CTA per (64 columns, chunk)
TK_GEMM_SPLIT2(64x64, 64, 64, 2, 2, 64, 4)   // decode, M <= 64

// gemm_staged_m{R}_s{S}c{CPS}: ops.py (GEMM_STAGED) launches 32 * (kGsCW + 1) threads and S * (R + 16) * gs_rs(CPS)
// bytes of dynamic shared memory
#define TK_GEMM_STAGED(R, S, CPS)                                                                                  \
  extern "C" __global__ void __launch_bounds__(32 * (kGsCW + 1)) gemm_staged_m##R##_s##S##c##CPS##_bf16(          \
      const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w,                           \
      __nv_bfloat16* __restrict__ y, int M, int N, int K) { pdl_entry();                                           \
    gemm_staged_impl<R, S, CPS, false>(x, ldx, w, y, M, N, K);                                                   \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(32 * (kGsCW + 1)) gemm_staged_m##R##_s##S##c##CPS##_f32(           \
      const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w, float* __restrict__ y,    \
      int M, int N, int K) { pdl_entry();                                                                          \
    gemm_staged_impl<R, S, CPS, true>(x, ldx, w, y, M, N, K);                                                    \
  }
TK_GEMM_STAGED(8, 4, 1)    // decode, M <= 8
TK_GEMM_STAGED(8, 4, 2)
TK_GEMM_STAGED(16, 3, 1)   // M <= 16
TK_GEMM_STAGED(16, 3, 2)
TK_GEMM_STAGED(32, 2, 1)   // M <= 32
TK_GEMM_STAGED(32, 4, 1)

// gemm_wide_m{R}_n{TW}_k{KS}s{S}{,w8,w16}_{bf16,f32,swiglu}: ops.py (GEMM_WIDE) launches 32 * (CW + 1) threads (CW = 4
// consumer warps, 8 or 16 with "w8", "w16") and 1024 + S * (TW + R) * KS * 2 bytes of dynamic shared memory, with
// tensor maps of W (boxes of TW rows; "swiglu": launch.encode_swiglu_map's, TW / 16 groups of 8 gate and 8 up rows)
// and x (R rows) by KS columns. Its first statement is the impl: the producer copies the weights of its first `pre`
// stages before its PDL wait, and the consumers wait before anything else.
#define TK_GEMM_WIDE_CW(R, TW, KS, S, CW, SFX)                                                                     \
  extern "C" __global__ void __launch_bounds__(32 * (CW + 1), 1) gemm_wide_m##R##_n##TW##_k##KS##s##S##SFX##_bf16( \
      const __grid_constant__ TensorMap wmap, const __grid_constant__ TensorMap xmap, __nv_bfloat16* __restrict__ y, \
      int M, int N, int K, int pre, int trigger) {                                                                 \
    gemm_wide_impl<R, TW, KS, S, CW, false, false>(&wmap, &xmap, y, M, N, K, pre, trigger);                      \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(32 * (CW + 1), 1) gemm_wide_m##R##_n##TW##_k##KS##s##S##SFX##_f32(  \
      const __grid_constant__ TensorMap wmap, const __grid_constant__ TensorMap xmap, float* __restrict__ y,       \
      int M, int N, int K, int pre, int trigger) {                                                                 \
    gemm_wide_impl<R, TW, KS, S, CW, true, false>(&wmap, &xmap, y, M, N, K, pre, trigger);                       \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(32 * (CW + 1), 1)                                                   \
      gemm_wide_m##R##_n##TW##_k##KS##s##S##SFX##_swiglu(const __grid_constant__ TensorMap wmap,                   \
                                                         const __grid_constant__ TensorMap xmap,                   \
                                                         __nv_bfloat16* __restrict__ y, int M, int N, int K,       \
                                                         int pre, int trigger) {                                   \
    gemm_wide_impl<R, TW, KS, S, CW, false, true>(&wmap, &xmap, y, M, N, K, pre, trigger);                       \
  }
#define TK_GEMM_WIDE(R, TW, KS, S) TK_GEMM_WIDE_CW(R, TW, KS, S, 4, )
#define TK_GEMM_WIDE_W8(R, TW, KS, S) TK_GEMM_WIDE_CW(R, TW, KS, S, 8, w8)
#define TK_GEMM_WIDE_W16(R, TW, KS, S) TK_GEMM_WIDE_CW(R, TW, KS, S, 16, w16)
TK_GEMM_WIDE(16, 64, 256, 4)       // up to 16 rows
TK_GEMM_WIDE(16, 64, 512, 2)
TK_GEMM_WIDE(32, 32, 256, 3)       // 17-32 rows; two CTAs a multiprocessor
TK_GEMM_WIDE(32, 64, 256, 4)
TK_GEMM_WIDE(32, 64, 512, 2)
TK_GEMM_WIDE(64, 32, 256, 2)       // 33-64 rows; two CTAs a multiprocessor
TK_GEMM_WIDE_W8(64, 32, 256, 2)    // eight consumer warps
TK_GEMM_WIDE_W8(64, 64, 256, 3)
TK_GEMM_WIDE_W8(128, 32, 256, 2)   // 65-128 rows
TK_GEMM_WIDE_W8(128, 64, 128, 4)
TK_GEMM_WIDE_W16(128, 64, 128, 4)  // sixteen
