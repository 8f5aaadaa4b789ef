// skinny_gemm.cu -- y = x W^T for the few rows of a decode step (M <= 16; the staged kernel below up to 32):
// the default mode's GEMM where cuBLAS leaves bandwidth on the table.
//
// Reference twin: reference/model.py, linear(x, w) (no fixed reduction order: this kernel is *not*
// used in batch-invariant mode, whose GEMM is gemm.cu).
//
// Layouts: x bf16 [M, K] (row stride ldx elements, K contiguous), W bf16 [N, K] contiguous (a torch
// Linear weight), y [M, N] contiguous, bf16 or fp32. K % 8 == 0, x and W 16-byte aligned (the host
// checks). (An input-side fusion of silu_mul was measured and dropped: every one of the N / 16 CTAs
// recomputes the whole activation row, which at the 8B down projection halved the bandwidth.)
//
// The SwiGLU epilogue (skinny_swiglu_*) saves a decode layer its silu_mul launch, with the bits of
// the unfused pair: W = [gate | up] [2I, K], and CTA b takes gate rows 8b .. 8b+7 as its rows 0-7 and
// up rows I+8b .. I+8b+7 as rows 8-15. A thread's C fragment then holds gate (c0, c1) and up (c2, c3)
// of the same output column and x rows, so it writes bf16(silu(bf16(gate)) * bf16(up)) -- what
// silu_mul computes from the bf16 GEMM output (activation.cu) -- and the [M, 2I] intermediate never
// exists. (A residual add + RMSNorm epilogue for o_proj / down_proj -- the last CTAs to finish fold
// the rows -- was measured and dropped: at the 8B shapes it was 0.6-1.4 us per call slower than the
// GEMM followed by add_rmsnorm; docs/performance/gemm.md, "Skinny GEMM".)
//
// At M <= 16 the product is a stream of the weights: 2 N K bytes, each read once, against 2 M K
// bytes of x (cache-resident). So the kernel is built around the weight stream:
//   * "swap AB": the weights are the 16-row A operand of mma.m16n8k16 and the (at most 16) rows of
//     x the 8-column B operand (MT = 1 or 2 of them), so no tensor-core lane is wasted on padding
//     rows of x beyond the 8 (16) that exist;
//   * weights go straight from global memory into A fragments with one 16-byte streaming load per
//     lane and row (no shared-memory staging). That works because a dot product may sum its k terms
//     in any order: lane (g, t) loads the 8 consecutive columns 8t .. 8t+7 of a 32-column block for
//     weight rows g and g+8, and the same 8 columns of x row g; mma step s (s = 0, 1) takes elements
//     4s .. 4s+3 of them as its "logical" columns {2t, 2t+1, 2t+8, 2t+9}. A and B use the same
//     permutation, so every product W[n, k] x[m, k] meets its own partner;
//   * a CTA owns 16 weight rows and its WARPS warps (4, 8 or 16: ops.skinny_warps) share K: warp w
//     takes the 32-column blocks w, w + WARPS, w + 2 WARPS, ... (U of them in flight per lane), so
//     that the CTA's warps read neighbouring stretches of each row. At the end the warps' fp32
//     partials are summed in warp order through shared memory (deterministic: the same inputs give
//     the same bits, and the result depends on M through nothing -- but on the kernel choice and the
//     warp count, hence default mode only).
// Fragment layouts: see attention.cu's header.

#include <cuda_bf16.h>

#include "mma.cuh"
#include "swiglu.cuh"
#include "pdl.cuh"
#include "skinny.cuh"
#include "tma.cuh"

#ifdef TK_STAGED_TRACE
__device__ unsigned long long staged_trace[4096][6];  // at namespace scope: found by name (trace_staged.py)
#endif
#ifdef TK_CLUSTER_TRACE
// trace_cluster.py: per CTA, 8 marks (TK_CL_MARK in the cluster kernel), and per stage i < 64 the producer's issue time and the
// consumers' landing time
__device__ unsigned long long cluster_trace[1024][8];
__device__ unsigned long long cluster_stage_trace[1024][64][2];
#endif

namespace {

constexpr int kU = 8;  // 32-column blocks in flight per lane (x2 rows x 16 bytes of weights each)

// The weight row behind row r (0 .. 15) of this CTA's 16, or -1 past the end. N is the output width:
// the weight's row count, or I for SwiGLU (whose weight has 2I rows: gate rows, then up rows; a CTA
// takes 8 of each). (A grid-stride loop over these 16-row tiles, fewer CTAs than tiles with a next-tile
// L2 prefetch, was measured and dropped: at the 8B shapes 132-528 CTAs were at best 1-2% faster than
// one CTA per tile (at M = 1), and up to 22% slower -- docs/performance/gemm.md, "Skinny GEMM".)
template <int EPI>
__device__ __forceinline__ int weight_row(int tile, int r, int N) {
  if constexpr (EPI == kSwiGLU) {
    const int i = tile * 8 + (r & 7);  // output column
    return i < N ? (r < 8 ? i : N + i) : -1;
  } else {
    const int n = tile * 16 + r;
    return n < N ? n : -1;
  }
}

// read once: not kept in L1, and a hint that L2 may fetch the whole 256-byte stretch of the row.
// TK_SKINNY_LD (an A/B switch of the device scripts): 1 allocates in L1, 2 drops the L2 hint, 3 both.
// Unlike the attention's bypassing cp.async (mma.cuh), these loads are not requested twice (202 MB
// from L2 for gate_up's 201 MB of weights), and on the H200 every variant was slower at the qwen3-8b
// shapes, M = 1-16 (1: +2.5 to +16.5%, 2: -0.3 to +2.2%, 3: +1.3 to +15.3%; docs/performance/gemm.md,
// "Skinny GEMM").
#ifndef TK_SKINNY_LD
#define TK_SKINNY_LD 0
#endif
#if TK_SKINNY_LD == 1
#define TK_SKINNY_LD_OP "ld.global.nc.L2::256B.v4.u32"
#elif TK_SKINNY_LD == 2
#define TK_SKINNY_LD_OP "ld.global.nc.L1::no_allocate.v4.u32"
#elif TK_SKINNY_LD == 3
#define TK_SKINNY_LD_OP "ld.global.nc.v4.u32"
#else
#define TK_SKINNY_LD_OP "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"
#endif
__device__ __forceinline__ uint4 ld_stream(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile(TK_SKINNY_LD_OP " {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// 8 bf16 of x row m (columns k .. k+7): small and reread by every CTA, so cached
__device__ __forceinline__ uint4 load_x8(const __nv_bfloat16* __restrict__ x, int ldx, int m, int k) {
  return __ldg(reinterpret_cast<const uint4*>(x + (long long)m * ldx + k));
}

// Programmatic dependent launch (pdl.cuh): while the previous kernel (the norm or activation that
// produces x) finishes, a CTA asks L2 for the first round of its weight stream -- the kU 32-column
// blocks per warp that skinny_impl loads first, one prefetch per 64-byte block and weight row. The
// weights are written by no kernel of a step, so this may precede pdl_wait(); x and y come after it.
// (Prefetching more -- a separate launch asking L2 for all of o_proj's weights before rope and
// attention, or for the first 8-32 MB of gate/up's before the norm -- was measured and dropped: the
// prefetch launch ran at about DRAM speed itself, and a decode step got 5% slower. docs/performance/gemm.md)
template <int WARPS, int EPI>
__device__ __forceinline__ void skinny_prefetch(const __nv_bfloat16* __restrict__ w, int N, int K) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int row = weight_row<EPI>(blockIdx.x, lane & 15, N);  // lanes 0-15 and 16-31: the 16 rows, two blocks each
  if (row < 0) return;
  const int nkb = (K + 31) >> 5;
#pragma unroll
  for (int u = 0; u < kU; u += 2) {  // blocks kb and kb + WARPS of the first round: 2 x 64 bytes
    const int kb = warp + (u + (lane >> 4)) * WARPS;
    if (kb < nkb) asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(w + (long long)row * K + (kb << 5))));
  }
}

// Fragment f: the W warps' (block groups') partials red[0 .. W - 1][f] added in that order, stored as tile
// `tile`, x rows m0 .. (the fold of the staged and the cluster kernels)
template <bool F32, int EPI, int NF, int W>
__device__ __forceinline__ void fold_store(const float (*red)[NF][4][32], int f, void* __restrict__ y, int tile, int m0,
                                           int lane, int M, int N) {
  float sum[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float v = red[0][f][c][lane];
#pragma unroll
    for (int ww = 1; ww < W; ++ww) v += red[ww][f][c][lane];
    sum[c] = v;
  }
  skinny_store<F32, EPI>(y, sum, tile, m0, lane, M, N);
}

template <int MT, int WARPS, bool F32, int EPI = kPlain>
__device__ __forceinline__ void skinny_impl(const __nv_bfloat16* __restrict__ x, int ldx,
                                            const __nv_bfloat16* __restrict__ w, void* __restrict__ y, int M, int N,
                                            int K) {
  __shared__ float red[WARPS][MT][4][32];  // per-warp C fragments, lane-major
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  // Loads are never skipped, only their results zeroed: out-of-range rows read weight row 0 (or x
  // row 0) and out-of-range columns column 0, so every load of a round is unconditional and can be
  // in flight at once (a branch around each load would let the compiler serialise them).
  const int row_a = weight_row<EPI>(blockIdx.x, g, N), row_b = weight_row<EPI>(blockIdx.x, g + 8, N);
  const bool ra = row_a >= 0, rb = row_b >= 0;
  const __nv_bfloat16* wa_p = w + (long long)max(row_a, 0) * K;
  const __nv_bfloat16* wb_p = w + (long long)max(row_b, 0) * K;
  bool xr[MT];
  int xm[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    xr[mt] = g + 8 * mt < M;
    xm[mt] = xr[mt] ? g + 8 * mt : 0;
  }

  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  const int nkb = (K + 31) >> 5;  // 32-column blocks
  for (int kb0 = warp; kb0 < nkb; kb0 += WARPS * kU) {
    uint4 wa[kU], wb[kU], xv[kU][MT];
#pragma unroll
    for (int u = 0; u < kU; ++u) {  // issue every load of the U blocks before the first mma
      const int k0 = ((kb0 + u * WARPS) << 5) + 8 * t;
      const bool in = kb0 + u * WARPS < nkb && k0 < K;
      const int k = in ? k0 : 0;
      wa[u] = ld_stream(wa_p + k);
      wb[u] = ld_stream(wb_p + k);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) xv[u][mt] = load_x8(x, ldx, xm[mt], k);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {  // zero what lies outside the problem only now: using a load's
      const bool in = kb0 + u * WARPS < nkb && ((kb0 + u * WARPS) << 5) + 8 * t < K;  // result waits for it
      if (!(in && ra)) wa[u] = z;
      if (!(in && rb)) wb[u] = z;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        if (!(in && xr[mt])) xv[u][mt] = z;
      const u32 a0[4] = {wa[u].x, wb[u].x, wa[u].y, wb[u].y};  // columns 0..3 of the lane's 8
      const u32 a1[4] = {wa[u].z, wb[u].z, wa[u].w, wb[u].w};  // columns 4..7
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(acc[mt], a0, xv[u][mt].x, xv[u][mt].y);
        mma_bf16(acc[mt], a1, xv[u][mt].z, xv[u][mt].w);
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) red[warp][mt][c][lane] = acc[mt][c];
  __syncthreads();
  if (tid < 32 * MT) {  // one thread per (n8 tile of x rows, lane of the fragment): sum warps in order
    const int mt = tid >> 5, l = tid & 31;
    float sum[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float v = red[0][mt][c][l];
#pragma unroll
      for (int ww = 1; ww < WARPS; ++ww) v += red[ww][mt][c][l];
      sum[c] = v;
    }
    skinny_store<F32, EPI>(y, sum, blockIdx.x, 8 * mt, l, M, N);
  }
}

// ---- The staged kernel (skinny_staged_*): the weight stream through shared memory by bulk copies ----
//
// Why a second kernel: the one above loads its weights straight into registers, one 16-byte load per
// lane and row, and a CTA's 16 rows are its whole life. On the large 8B weights that stream reached
// 3.6-3.8 TB/s where cuBLAS reached 4.2 (docs/performance/gemm.md, "Skinny GEMM"). Here the weights come into
// shared memory by cp.async.bulk (the 1-D form of the tensor memory accelerator: one instruction copies
// one row's chunk of KC columns, completion counted in bytes on an mbarrier), S stages deep, over a
// persistent grid:
//   * work: the 16-row tiles, whole (all of K). CTA c starts with tile c; the later tiles come from a
//     counter (counters[0], bumped by the producer), so a multiprocessor that streams faster takes more
//     of them. (A static split of the (tile, chunk) units into equal ranges, "stream-K", with the tiles
//     split between CTAs folded by the last one through a workspace, was measured first: the CTAs' last
//     stages landed up to 6 us apart on an 8B gate/up launch, and the fold cost each CTA ~3 us at its end;
//     docs/performance/gemm.md, "The staged skinny GEMM".)
//   * warp kStCW is the producer: its lane 0 waits for a stage to be empty, writes the stage's tile to
//     shared memory, announces the stage's bytes on its "full" barrier, and 16 lanes (PL = 16; lane 0
//     alone for PL = 1) issue one bulk copy per weight row. Before the PDL wait it may issue the first
//     `pre` stages of its first tile: the weights are written by no kernel of a step, so they may stream
//     in while the kernel before this one finishes; the counter is read only after the wait. When no
//     tile is left it marks the next stage "-1", and the last CTA out resets both counters;
//   * warps 0 .. kStCW-1 consume: per stage, warp w takes the 32-column blocks w, w + kStCW, .. of the
//     chunk, reads its A fragments from shared memory in the register kernel's permuted layout (lane
//     (g, t): row g and g + 8, columns 8t .. 8t+7 of the block) and x from global memory (cached), two
//     mma each, then arrives on the stage's "empty" barrier. At a tile's end the warps' partials are
//     summed in warp order through shared memory and stored.
// So warp w sums the blocks w, w + 4, w + 8, .. of each row in order, and the warps are added 0 .. 3:
// the order of skinny_impl with 4 warps, whatever KC, S, PL and the grid -- the bits of skinny_gemm's
// 4-warp kernels (check_kernels.py, "staged").
// Rows in a stage lie st_rs(KC) bytes apart, 64 (mod 128) past a multiple of the bank width, so that the 8
// lanes of a quarter-warp's 16-byte loads (rows g, g + 1: 64 bytes each) fall on distinct banks.
constexpr int kStCW = 4;  // consumer warps (the producer is warp kStCW)
// KC columns of a chunk (2 KC bytes of each row); rows of a stage st_rs(KC) bytes apart
__host__ __device__ constexpr int st_rs(int KC) { return KC * 2 + 64; }

__device__ __forceinline__ uint4 lds128(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// TK_STAGED_TRACE (a switch of benches/gpu/trace_staged.py): each CTA records %globaltimer (ns) at its
// start, after its consumers' PDL wait, when its first stage has landed, after its last stage and at its
// end, and its SM, in staged_trace[blockIdx.x]
#ifdef TK_STAGED_TRACE
__device__ __forceinline__ void st_mark(int k) {
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    staged_trace[blockIdx.x][k] = t;
    if (k == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      staged_trace[blockIdx.x][5] = sm;
    }
  }
}
#define TK_ST_MARK(k) st_mark(k)
#else
#define TK_ST_MARK(k)
#endif

// Wider decode steps (M up to 16 or 32): MT n8 tiles of x rows (1, 2 or 4) share every A fragment, and
// each stage may hold TP (1 or 2) 16-row tiles -- a "unit" of 16 TP rows, the counter's grain -- so that a
// stage's x, read by every unit, serves 16 TP weight rows. Neither changes a sum: each output element is
// still the chain of its row's 32-column blocks w, w + 4, .. in warp w, the warps added 0 .. 3, so the
// bits are those of MT = TP = 1 for every row (and skinny_gemm(warps=4)'s where that takes M).
// The per-warp partials of a unit: two units' worth when TP MT <= 2, else one, with a second consumer
// barrier after the fold (static shared memory stays at 16 KB for TP MT = 8).
// (On the H200 the 16-row build beat cuBLAS on small weights only, and the 32-row builds nowhere: a unit reads
// its chunk's x rows from L2, M / (16 TP) times its weight bytes, where cuBLAS's tiles are 64-192 weight rows
// wide. docs/performance/gemm.md, "The staged GEMM above 8 rows".)
template <int TP, int MT>
__host__ __device__ constexpr int st_red_bufs() { return TP * MT <= 2 ? 2 : 1; }

// The weight row behind row r (0 .. 16 TP - 1) of unit u, or -1 (weight_row of its tile r / 16)
template <int EPI, int TP>
__device__ __forceinline__ int unit_row(int u, int r, int N) {
  if constexpr (TP == 1)
    return weight_row<EPI>(u, r, N);
  else
    return weight_row<EPI>(u * TP + r / 16, r % 16, N);
}

template <int KC, int S, int PL, bool F32, int EPI, int MT = 1, int TP = 1>
__device__ __forceinline__ void skinny_staged_impl(const __nv_bfloat16* __restrict__ x, int ldx,
                                                   const __nv_bfloat16* __restrict__ w, void* __restrict__ y,
                                                   int M, int N, int K, int* __restrict__ counters, int pre,
                                                   int evict) {
  constexpr int kRS = st_rs(KC), kStage = 16 * TP * kRS, kBlocks = KC / 32, kNB = kBlocks / kStCW;
  constexpr int kRed = st_red_bufs<TP, MT>();
  static_assert(KC % (32 * kStCW) == 0 && (kRS % 128) == 64 && (PL == 1 || PL == 16), "staged layout");
  static_assert((MT == 1 || MT == 2 || MT == 4) && (TP == 1 || TP == 2), "staged widths");
  extern __shared__ __align__(128) unsigned char st_smem[];  // S stages of 16 TP rows x kRS bytes
  __shared__ __align__(8) u64 bars[2 * S];                   // full[s], then empty[s]
  __shared__ int stage_tile[S];                              // the unit a stage holds a chunk of; -1: no more
  __shared__ float red[kRed][kStCW][TP * MT][4][32];         // per-warp C fragments of kRed units
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tiles = EPI == kSwiGLU ? N / 8 : (N + 15) / 16;
  const int units = (tiles + TP - 1) / TP;  // unit u: tiles TP u .. TP u + TP - 1
  const int kch = (K + KC - 1) / KC;  // chunks of a tile
  const u32 base = smem_u32(st_smem), bar_full = smem_u32(bars), bar_empty = bar_full + 8 * S;
  TK_ST_MARK(0);
  if (tid == 0) {
    mbar_init_stages<S>(bar_full, bar_empty, kStCW);
    mbar_fence_init();
  }
  __syncthreads();

  if (warp == kStCW) {  // ---- producer: lane 0 (PL = 1) or lanes 0-15 (PL = 16, one weight row each)
    if (lane >= PL) return;
    const u64 policy = l2_evict_first();
    bool waited = false;
    int t = blockIdx.x;  // the first unit is the CTA's own; later ones come from counters[0]
    for (int i = 0, kc = 0;; ++i) {
      const int s = i % S;
      if (i == pre && !waited) {  // stages from `pre` on wait for the kernel before
        pdl_wait();               // (a thread that exits counts as triggered)
        pdl_launch_dependents();
        waited = true;
      }
      if (i >= S) mbar_wait(bar_empty + 8 * s, (u32)((i / S) + 1) & 1u);  // its previous use consumed
      if (t >= units) {  // no unit left: tell the consumers, count this CTA out
        if (lane == 0) {
          stage_tile[s] = -1;
          mbar_arrive(bar_full + 8 * s);
          __threadfence();  // this CTA's last grab is before its exit count
          if (atomicAdd(counters + 1, 1) == (int)gridDim.x - 1) {  // the last CTA out: both counters back to 0
            counters[0] = 0;
            counters[1] = 0;
          }
        }
        return;
      }
      const int k0 = kc * KC;
      const u32 bytes = (u32)min(KC, K - k0) * 2u;
      if (lane == 0) {
        int rows = 0;
#pragma unroll
        for (int r = 0; r < 16 * TP; ++r) rows += unit_row<EPI, TP>(t, r, N) >= 0;
        stage_tile[s] = t;  // published by the arrive below (release), read after the consumers' wait
        mbar_expect_tx(bar_full + 8 * s, bytes * rows);
      }
      if constexpr (PL == 16) __syncwarp(0xffffu);  // the bytes are announced before any copy lands
#pragma unroll
      for (int r = lane; r < 16 * TP; r += PL) {
        const int row = unit_row<EPI, TP>(t, r, N);
        if (row < 0) continue;
        const u32 dst = base + s * kStage + r * kRS;
        if (evict)
          bulk_copy_hint(dst, w + (long long)row * K + k0, bytes, bar_full + 8 * s, policy);
        else
          bulk_copy(dst, w + (long long)row * K + k0, bytes, bar_full + 8 * s);
      }
      if (++kc == kch) {  // the next unit: the counter hands them out in order after the first wave
        kc = 0;
        if (!waited) {
          pdl_wait();
          pdl_launch_dependents();
          waited = true;
        }
        int next = 0;
        if (lane == 0) next = (int)gridDim.x + atomicAdd(counters, 1);
        if constexpr (PL == 16) next = __shfl_sync(0xffffu, next, 0);
        t = next;
      }
    }
  }

  // ---- consumers
  pdl_wait();
  pdl_launch_dependents();
  TK_ST_MARK(1);
  const int g = lane >> 2, t4 = lane & 3;
  bool xr[MT];
  int xm[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    xr[mt] = g + 8 * mt < M;
    xm[mt] = xr[mt] ? g + 8 * mt : 0;
  }
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  float acc[TP][MT][4];
#pragma unroll
  for (int p = 0; p < TP; ++p)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[p][mt][0] = acc[p][mt][1] = acc[p][mt][2] = acc[p][mt][3] = 0.f;
  int par = 0;  // which of red's units this unit's partials go to
  for (int i = 0, kc = 0;; ++i) {
    const int s = i % S;
    const int k0 = kc * KC;
    const int cols = min(KC, K - k0);
    uint4 xv[kNB][MT];
#pragma unroll
    for (int j = 0; j < kNB; ++j) {  // x first: chunk kc of x is the same for every unit
      const int kk = (warp + j * kStCW) * 32 + 8 * t4;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) xv[j][mt] = load_x8(x, ldx, xm[mt], kk < cols ? k0 + kk : 0);
    }
    mbar_wait(bar_full + 8 * s, (u32)(i / S) & 1u);
#ifdef TK_STAGED_TRACE
    if (i == 0) TK_ST_MARK(2);
#endif
    const int t = *reinterpret_cast<volatile int*>(stage_tile + s);
    if (t < 0) break;
#ifdef TK_STAGED_TRACE
    TK_ST_MARK(3);
#endif
#pragma unroll
    for (int p = 0; p < TP; ++p) {  // tile t TP + p of the unit: rows 16 p .. 16 p + 15 of the stage
      const bool ra = weight_row<EPI>(t * TP + p, g, N) >= 0, rb = weight_row<EPI>(t * TP + p, g + 8, N) >= 0;
      const u32 st = base + s * kStage + p * 16 * kRS;
#pragma unroll
      for (int j = 0; j < kNB; ++j) {
        const int b = warp + j * kStCW;
        if (b * 32 < cols) {  // warp-uniform: blocks past a ragged last chunk are skipped
          const int kk = b * 32 + 8 * t4;
          const bool in = kk < cols;
          uint4 wa = lds128(st + g * kRS + kk * 2), wb = lds128(st + (g + 8) * kRS + kk * 2);
          if (!(in && ra)) wa = z;  // rows past N were not copied, columns past K belong to no row
          if (!(in && rb)) wb = z;
          uint4 xx[MT];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) xx[mt] = in && xr[mt] ? xv[j][mt] : z;
          const u32 a0[4] = {wa.x, wb.x, wa.y, wb.y};
          const u32 a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {  // every n8 tile of x rows takes the same A fragments
            mma_bf16(acc[p][mt], a0, xx[mt].x, xx[mt].y);
            mma_bf16(acc[p][mt], a1, xx[mt].z, xx[mt].w);
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_empty + 8 * s);
    if (++kc != kch) continue;

    // ---- the end of unit t: the warps' partials summed in warp order, stored (fragment f = (p, mt) by warp
    // f mod kStCW)
    kc = 0;
#pragma unroll
    for (int p = 0; p < TP; ++p)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          red[par][warp][p * MT + mt][c][lane] = acc[p][mt][c];
          acc[p][mt][c] = 0.f;
        }
    asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kStCW) : "memory");  // the consumer warps only
#pragma unroll
    for (int f = 0; f < TP * MT; ++f) {
      if (f % kStCW != warp) continue;
      fold_store<F32, EPI, TP * MT, kStCW>(red[par], f, y, t * TP + f / MT, 8 * (f % MT), lane, M, N);
    }
    if constexpr (kRed == 1)
      asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kStCW) : "memory");  // folded: red is free again
    else
      par ^= 1;
  }
  TK_ST_MARK(4);
}

// ---- The cluster kernel (skinny_cluster_*): decode steps of 17-64 rows ----
//
// Why a third kernel: above 16 rows the staged kernel's x reads are what it waits on -- every unit of 16 TP
// weight rows reads all M rows of each chunk of x from L2, M / (16 TP) times its weight bytes, and at 32 rows
// it lost to cuBLAS on every GEMM (docs/performance/gemm.md, "The staged GEMM above 8 rows"). Here the C CTAs of
// a thread-block cluster share each chunk of x: CTA q of the cluster copies the x rows 64 q / C .. of a chunk
// into the same stage of every CTA of the cluster by one multicast tensor copy, so L2 serves a chunk of x once
// per cluster (M / (16 TP C) times the weight bytes).
//   * copies: tensor copies (cp.async.bulk.tensor) through two 3-D tensor maps the host encodes
//     (ops.skinny_cluster): a [rows, K] matrix seen as (64 columns, K / 64 blocks of them, rows), boxes of
//     (64, KC / 64, 8) weight rows and (64, KC / 64, 64 / C) x rows, 128-byte swizzled. One copy a box: a stage
//     of TP = 2 takes 2 TP + 1 copies from each CTA's producer. (The first version copied one row a copy, 48 a
//     stage, and ran at a fifth of cuBLAS's rate: the SM's copy engine took ~45 ns a copy whatever its size,
//     benches/gpu/trace_cluster.py, docs/performance/gemm.md);
//   * a stage holds the 16 TP weight rows of the CTA's unit, then 64 rows of x, each row 2 KC bytes, its 16-byte
//     pieces swizzled as the copies write them: piece j of the 128-byte line l (stage offset 128 l + 16 j) is at
//     128 l + 16 (j ^ (l mod 8)) (stages 1024-byte aligned). Rows past N or M and columns past K arrive as zeros;
//   * work: static. CTA b takes the units b, b + G, b + 2G, .. (G CTAs); every CTA runs the same number of
//     stages, since a cluster's stages advance together: a CTA past the last unit still copies its share of
//     x and waits for its stages, and computes and stores nothing;
//   * a stage's "full" barrier expects its weight boxes and all C x boxes (from all C producers); its "empty"
//     barrier counts the consumer warps of all C CTAs, each of which arrives on every CTA's: a producer writes
//     a stage of its peers only once all of them have consumed it;
//   * the producer may issue the weights of the first `pre` stages before its PDL wait; x, which the kernel
//     before writes, only after it;
//   * the consumers are the staged kernel's (warp w takes the 32-column blocks w, w + 4, .. of each chunk,
//     the warps' partials folded 0 .. 3), with x's fragments from shared memory, each read once for the TP
//     tiles: the same sums in the same order, so a row's bits are the 8-row staged kernel's (check_kernels.py,
//     "cluster");
//   * nobody leaves before the cluster's last barrier: a peer may still copy into this CTA's stages or
//     arrive on its barriers.
// MT = 8: up to 64 rows (rows past M are zeros and not stored).
// (swz128, tma.cuh: the 128-byte swizzle of the tensor copies)
// the first weight row of box h (0, 1: 8 rows each) of tile t, or -1 past the weight (weight_row's rows)
template <int EPI>
__device__ __forceinline__ int box_row(int t, int h, int N) {
  if constexpr (EPI == kSwiGLU)
    return 8 * t < N ? (h == 0 ? 8 * t : N + 8 * t) : -1;
  else
    return 16 * t + 8 * h < N ? 16 * t + 8 * h : -1;
}

// TK_CLUSTER_TRACE (a switch of benches/gpu/trace_cluster.py): %globaltimer (ns) of CTA blockIdx.x at its
// start (0), after the first cluster barrier (1), after the consumers' PDL wait (2), when its first stage has
// landed (3), after its last stage (4) and at its end (5); its SM (6) and cluster rank (7). And per stage the
// time the producer issued its copies (after the stage's "empty" wait) and the time the consumers saw it full.
#ifdef TK_CLUSTER_TRACE
__device__ __forceinline__ unsigned long long cl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define TK_CL_MARK(k)                                                                    \
  do {                                                                                   \
    if (threadIdx.x == 0 && blockIdx.x < 1024) cluster_trace[blockIdx.x][k] = cl_now(); \
  } while (0)
#define TK_CL_STAGE(i, j)                                                                  \
  do {                                                                                     \
    if (blockIdx.x < 1024 && (i) < 64) cluster_stage_trace[blockIdx.x][(i)][(j)] = cl_now(); \
  } while (0)
#else
#define TK_CL_MARK(k)
#define TK_CL_STAGE(i, j)
#endif

// SPLIT = 2 (TP = 2): eight consumer warps, warp w taking the blocks of warp w mod 4 for tile w / 4 only -- two
// warps a scheduler, the same sums in the same order (the fold adds the four block groups of a tile in order).
template <int KC, int S, bool F32, int EPI, int TP, int C, int SPLIT = 1>
__device__ __forceinline__ void skinny_cluster_impl(const TensorMap* wmap, const TensorMap* xmap,
                                                    void* __restrict__ y, int M, int N, int K, int pre, int evict) {
  constexpr int MT = 8, kRow = 2 * KC, kWRows = 16 * TP, kStage = (kWRows + 8 * MT) * kRow, kXRows = 64 / C;
  constexpr int kBlocks = KC / 32, kNB = kBlocks / kStCW, kCW = kStCW * SPLIT, TPW = TP / SPLIT;
  static_assert((SPLIT == 1 || SPLIT == 2) && TP % SPLIT == 0, "cluster split");
  static_assert(KC % 64 == 0 && KC % (32 * kStCW) == 0 && kStage % 1024 == 0, "cluster layout");
  static_assert((TP == 1 || TP == 2) && (C == 2 || C == 4), "cluster widths");
  extern __shared__ __align__(128) unsigned char st_smem[];  // up to 1 KB of slack (aligned below), then S stages
  __shared__ __align__(8) u64 bars[2 * S];                    // full[s], then empty[s]
  __shared__ float red[kStCW][TP * MT][4][32];                // per-warp C fragments of a unit
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tiles = EPI == kSwiGLU ? N / 8 : (N + 15) / 16;
  const int units = (tiles + TP - 1) / TP;
  const int kch = (K + KC - 1) / KC;
  const int total = (units + (int)gridDim.x - 1) / (int)gridDim.x * kch;  // stages of every CTA
  const u32 rank = cluster_rank();
  const u32 base = (smem_u32(st_smem) + 1023u) & ~1023u;  // the swizzle's pattern repeats every 1024 bytes
  const u32 bar_full = smem_u32(bars), bar_empty = bar_full + 8 * S;
  const int xboxes = (M + kXRows - 1) / kXRows;  // x boxes a stage gets, one from each of the first xboxes CTAs
  TK_CL_MARK(0);
#ifdef TK_CLUSTER_TRACE
  if (tid == 0 && blockIdx.x < 1024) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    cluster_trace[blockIdx.x][6] = sm;
    cluster_trace[blockIdx.x][7] = rank;
  }
#endif
  if (warp == kCW && lane == 0) {  // the maps' first fetch, ahead of the producer's first copy
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(wmap)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(xmap)) : "memory");
  }
  if (tid == 0) {
    mbar_init_stages<S>(bar_full, bar_empty, C * kCW);
    mbar_fence_init();
  }
  cluster_sync_all();  // every CTA's barriers exist before any copy or arrival reaches them
  TK_CL_MARK(1);

  if (warp == kCW) {  // ---- producer: lane 0
    if (lane == 0) {
      const u64 policy = l2_evict_first();
      const int early = min(min(pre, S), total);
      // stage i's weight boxes (and the bytes the stage expects, x's included)
      auto weights = [&](int i) {
        const int s = i % S, u = (int)blockIdx.x + i / kch * (int)gridDim.x, k0 = i % kch * KC;
        int boxes = 0;
#pragma unroll
        for (int p = 0; p < TP; ++p)
#pragma unroll
          for (int h = 0; h < 2; ++h) boxes += u < units && box_row<EPI>(u * TP + p, h, N) >= 0;
        mbar_expect_tx(bar_full + 8 * s, (u32)(boxes * 8 + xboxes * kXRows) * (u32)kRow);
#pragma unroll
        for (int p = 0; p < TP; ++p)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r0 = u < units ? box_row<EPI>(u * TP + p, h, N) : -1;
            if (r0 >= 0)
              tensor_copy(base + s * kStage + (16 * p + 8 * h) * kRow, wmap, 0, k0 / 64, r0, bar_full + 8 * s, policy,
                          evict);
          }
      };
      for (int i = 0; i < early; ++i) {
        TK_CL_STAGE(i, 0);
        weights(i);
      }
      pdl_wait();  // x is the kernel before's output
      pdl_launch_dependents();
      const unsigned short mask = (unsigned short)((1u << C) - 1u);
      for (int i = 0; i < total; ++i) {
        const int s = i % S, k0 = i % kch * KC;
        if (i >= early) {  // stage i's weights, after its previous use was consumed by the whole cluster
          if (i >= S) mbar_wait(bar_empty + 8 * s, (u32)((i / S) + 1) & 1u);  // (the peers' arrivals: see above)
          TK_CL_STAGE(i, 0);
          weights(i);
        }
        // this CTA's box of stage i's x rows, into every CTA of the cluster
        if ((int)rank < xboxes)
          tensor_copy_multicast(base + s * kStage + (kWRows + (int)rank * kXRows) * kRow, xmap, 0, k0 / 64,
                                (int)rank * kXRows, bar_full + 8 * s, mask);
      }
    }
    __syncwarp();
  } else {  // ---- consumers
    pdl_wait();
    pdl_launch_dependents();
    TK_CL_MARK(2);
    const int g = lane >> 2, t4 = lane & 3, bw = warp & (kStCW - 1), p0 = warp / kStCW * TPW;
    bool xr[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) xr[mt] = g + 8 * mt < M;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    float acc[TPW][MT][4];  // tiles p0 .. p0 + TPW - 1 of the unit
#pragma unroll
    for (int p = 0; p < TPW; ++p)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc[p][mt][0] = acc[p][mt][1] = acc[p][mt][2] = acc[p][mt][3] = 0.f;
    for (int i = 0; i < total; ++i) {
      const int s = i % S, kc = i % kch, u = (int)blockIdx.x + i / kch * (int)gridDim.x;
      const int cols = min(KC, K - kc * KC);
      mbar_wait(bar_full + 8 * s, (u32)(i / S) & 1u);
      if (tid == 0) TK_CL_STAGE(i, 1);
      if (i == 0) TK_CL_MARK(3);
      if (u < units) {
        // Per 32-column block: its fragments first, then the MMAs with a0 for every (x tile, weight tile), then
        // those with a1 (each product's pair of MMAs is dependent; one consumer warp a scheduler). Each
        // accumulator sees a0 then a1 of block w, then of block w + 4: the staged kernel's sums in its order.
        const u32 st = base + s * kStage;
#pragma unroll
        for (int j = 0; j < kNB; ++j) {
          const int kk = (bw + j * kStCW) * 32 + 8 * t4;
          if (kk - 8 * t4 >= cols) continue;  // warp-uniform: blocks past a ragged last chunk add nothing
          const bool in = kk < cols;
          u32 a0[TPW][4], a1[TPW][4];
          uint4 xx[MT];
#pragma unroll
          for (int p = 0; p < TPW; ++p) {  // tile u TP + p0 + p: rows 16 (p0 + p) .. of the stage
            const int t = u * TP + p0 + p, r = 16 * (p0 + p);
            const bool ra = weight_row<EPI>(t, g, N) >= 0, rb = weight_row<EPI>(t, g + 8, N) >= 0;
            uint4 wa = lds128(st + swz128((r + g) * kRow + kk * 2));
            uint4 wb = lds128(st + swz128((r + g + 8) * kRow + kk * 2));
            if (!(in && ra)) wa = z;  // rows past N, columns past K: zeros (as the staged kernel reads them)
            if (!(in && rb)) wb = z;
            a0[p][0] = wa.x; a0[p][1] = wb.x; a0[p][2] = wa.y; a0[p][3] = wb.y;
            a1[p][0] = wa.z; a1[p][1] = wb.z; a1[p][2] = wa.w; a1[p][3] = wb.w;
          }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)  // x rows g + 8 mt (tiles past M, warp-uniform, skipped below)
            xx[mt] = in && xr[mt] ? lds128(st + swz128((kWRows + g + 8 * mt) * kRow + kk * 2)) : z;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            if (8 * mt < M)
#pragma unroll
              for (int p = 0; p < TPW; ++p) mma_bf16(acc[p][mt], a0[p], xx[mt].x, xx[mt].y);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            if (8 * mt < M)
#pragma unroll
              for (int p = 0; p < TPW; ++p) mma_bf16(acc[p][mt], a1[p], xx[mt].z, xx[mt].w);
        }
      }
      __syncwarp();
      if (lane < C) mbar_arrive_peer(bar_empty + 8 * s, (u32)lane);  // consumed, in every CTA's count
      if (kc != kch - 1 || u >= units) continue;

      // ---- the end of unit u: the block groups' partials summed in order 0 .. 3, stored (fragment f by warp
      // f mod kCW)
#pragma unroll
      for (int p = 0; p < TPW; ++p)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            red[bw][(p0 + p) * MT + mt][c][lane] = acc[p][mt][c];
            acc[p][mt][c] = 0.f;
          }
      asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kCW) : "memory");  // the consumer warps only
#pragma unroll
      for (int f = 0; f < TP * MT; ++f) {
        if (f % kCW != warp) continue;
        fold_store<F32, EPI, TP * MT, kStCW>(red, f, y, u * TP + f / MT, 8 * (f % MT), lane, M, N);
      }
      asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kCW) : "memory");  // folded: red is free again
    }
    __syncwarp();
    TK_CL_MARK(4);
  }
  cluster_sync_all();  // nobody leaves while a peer may still copy into its stages or arrive on its barriers
  TK_CL_MARK(5);
}

}  // namespace

// skinny_m{8,16}_w{4,8,16}_{bf16,f32}: MT = M-tile count (M <= 8: one, M <= 16: two), WARPS per CTA,
// output bf16 / fp32. Grid: ceil(N / 16) CTAs. `prefetch` (0 / 1): the first round's L2 prefetch before
// the PDL wait (skinny_prefetch) or none. The "1" of __launch_bounds__ matters: without a
// minimum-blocks figure ptxas kept ~46 registers and interleaved the loads of a round with its mma
// (one round of loads in flight at a time); with it, all kU rounds' loads are in flight (114-150 regs).
#define TK_SKINNY(MTV, MV, WV, SUF, F32V)                                                                    \
  extern "C" __global__ void __launch_bounds__(32 * WV, 1) skinny_m##MV##_w##WV##_##SUF(                       \
      const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w, void* __restrict__ y, \
      int M, int N, int K, int prefetch) {                                                                   \
    if (prefetch) skinny_prefetch<WV, kPlain>(w, N, K); /* the weights depend on no kernel: before the wait */ \
    pdl_wait();                                                                                              \
    pdl_launch_dependents();                                                                                 \
    skinny_impl<MTV, WV, F32V>(x, ldx, w, y, M, N, K);                                                       \
  }
// skinny_swiglu_m{8,16}_w{4,8,16}: y [M, I] bf16 = silu(x Wg^T) * (x Wu^T), W = [Wg | Wu] [2I, K];
// I % 8 == 0; grid I / 8 CTAs.
#define TK_SWIGLU(MTV, MV, WV)                                                                                \
  extern "C" __global__ void __launch_bounds__(32 * WV, 1) skinny_swiglu_m##MV##_w##WV(                        \
      const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w, void* __restrict__ y, \
      int M, int I, int K, int prefetch) {                                                                   \
    if (prefetch) skinny_prefetch<WV, kSwiGLU>(w, I, K);                                                     \
    pdl_wait();                                                                                              \
    pdl_launch_dependents();                                                                                 \
    skinny_impl<MTV, WV, false, kSwiGLU>(x, ldx, w, y, M, I, K);                                             \
  }
#define TK_SKINNY_W(MTV, MV, WV)       \
  TK_SKINNY(MTV, MV, WV, bf16, false)  \
  TK_SKINNY(MTV, MV, WV, f32, true)    \
  TK_SWIGLU(MTV, MV, WV)
TK_SKINNY_W(1, 8, 4)
TK_SKINNY_W(1, 8, 8)
TK_SKINNY_W(1, 8, 16)
TK_SKINNY_W(2, 16, 4)
TK_SKINNY_W(2, 16, 8)
TK_SKINNY_W(2, 16, 16)
// skinny_staged_k{KC}s{S}p{PL}_{bf16,f32,swiglu}: the staged kernel with chunks of KC columns, S stages and
// PL producer lanes (M <= 8; output bf16, fp32, or the SwiGLU epilogue with N = I). Grid: G persistent CTAs
// (at most one per tile) of 32 (kStCW + 1) threads, S * 16 * st_rs(KC) bytes of dynamic shared memory;
// counters: two ints, zero (and left zero). pre: stages the producer may issue before its PDL wait. evict:
// 1: the weight copies at L2 priority evict-first (l2_evict_first), 0: copies without a hint.
#define TK_STAGED_K(KCV, SV, PLV, SUF, F32V, EPIV)                                                            \
  extern "C" __global__ void __launch_bounds__(32 * (kStCW + 1), 1) skinny_staged_k##KCV##s##SV##p##PLV##_##SUF( \
      const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w, void* __restrict__ y, \
      int M, int N, int K, int* __restrict__ counters, int pre, int evict) {                                  \
    skinny_staged_impl<KCV, SV, PLV, F32V, EPIV>(x, ldx, w, y, M, N, K, counters, pre, evict);               \
  }
#define TK_STAGED(KCV, SV, PLV)                        \
  TK_STAGED_K(KCV, SV, PLV, bf16, false, kPlain)       \
  TK_STAGED_K(KCV, SV, PLV, f32, true, kPlain)         \
  TK_STAGED_K(KCV, SV, PLV, swiglu, false, kSwiGLU)
// skinny_staged_k{KC}s{S}p{PL}t{TP}_m{16,32}_{bf16,f32,swiglu}: the same for M <= 16 or 32 rows (MT = 2, 4)
// with TP 16-row tiles a stage; S * 16 * TP * st_rs(KC) bytes of dynamic shared memory.
#define TK_STAGED_WK(KCV, SV, PLV, TPV, MV, MTV, SUF, F32V, EPIV)                                             \
  extern "C" __global__ void __launch_bounds__(32 * (kStCW + 1), 1)                                          \
      skinny_staged_k##KCV##s##SV##p##PLV##t##TPV##_m##MV##_##SUF(                                            \
          const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w,                  \
          void* __restrict__ y, int M, int N, int K, int* __restrict__ counters, int pre, int evict) {        \
    skinny_staged_impl<KCV, SV, PLV, F32V, EPIV, MTV, TPV>(x, ldx, w, y, M, N, K, counters, pre, evict);     \
  }
#define TK_STAGED_W(KCV, SV, PLV, TPV, MV, MTV)                        \
  TK_STAGED_WK(KCV, SV, PLV, TPV, MV, MTV, bf16, false, kPlain)        \
  TK_STAGED_WK(KCV, SV, PLV, TPV, MV, MTV, f32, true, kPlain)          \
  TK_STAGED_WK(KCV, SV, PLV, TPV, MV, MTV, swiglu, false, kSwiGLU)
TK_STAGED(512, 2, 16)
TK_STAGED(512, 3, 16)
TK_STAGED(512, 4, 16)
TK_STAGED(1024, 3, 16)
TK_STAGED(1024, 4, 16)
TK_STAGED(2048, 2, 16)
TK_STAGED(2048, 3, 16)
TK_STAGED_W(512, 3, 16, 1, 16, 2)
TK_STAGED_W(512, 4, 16, 1, 16, 2)
TK_STAGED_W(512, 3, 16, 1, 32, 4)
TK_STAGED_W(512, 2, 16, 2, 32, 4)
// skinny_cluster_k{KC}s{S}t{TP}c{C}[w8]_m64_{bf16,f32,swiglu}: the cluster kernel for M <= 64 rows with chunks of
// KC columns, S stages, TP 16-row tiles a unit, clusters of C CTAs along x; w8: eight consumer warps (SPLIT = 2).
// Grid: a multiple of C CTAs of 32 (4 SPLIT + 1) threads, launched as clusters of C; 1024 + S (16 TP + 64) 2 KC
// bytes of dynamic shared memory. wmap, xmap: the tensor maps of w ([N or 2 I, K]) and x ([M, K]) that
// ops.skinny_cluster encodes.
#define TK_CLUSTER_K(KCV, SV, TPV, CV, SPV, WS, SUF, F32V, EPIV)                                              \
  extern "C" __global__ void __launch_bounds__(32 * (kStCW * SPV + 1), 1)                                    \
      skinny_cluster_k##KCV##s##SV##t##TPV##c##CV##WS##_m64_##SUF(                                            \
          const __grid_constant__ TensorMap wmap, const __grid_constant__ TensorMap xmap, void* __restrict__ y, \
          int M, int N, int K, int pre, int evict) {                                                          \
    skinny_cluster_impl<KCV, SV, F32V, EPIV, TPV, CV, SPV>(&wmap, &xmap, y, M, N, K, pre, evict);             \
  }
#define TK_CLUSTER(KCV, SV, TPV, CV, SPV, WS)                      \
  TK_CLUSTER_K(KCV, SV, TPV, CV, SPV, WS, bf16, false, kPlain)     \
  TK_CLUSTER_K(KCV, SV, TPV, CV, SPV, WS, f32, true, kPlain)       \
  TK_CLUSTER_K(KCV, SV, TPV, CV, SPV, WS, swiglu, false, kSwiGLU)
TK_CLUSTER(256, 3, 2, 4, 1, )
TK_CLUSTER(256, 4, 2, 4, 1, )
TK_CLUSTER(256, 5, 1, 4, 1, )
TK_CLUSTER(512, 2, 2, 4, 1, )
TK_CLUSTER(256, 4, 2, 4, 2, w8)
TK_CLUSTER(512, 2, 2, 4, 2, w8)
