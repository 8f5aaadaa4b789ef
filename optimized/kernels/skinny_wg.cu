// skinny_wg.cu -- y = x W^T for decode steps of 17-64 rows with warpgroup MMAs (wgmma, sm_90a).
//
// Reference twin: reference/model.py, linear(x, w) (default mode only, like skinny_gemm.cu: the sums' order
// depends on the configuration). Layouts as skinny_gemm.cu: x bf16 [M, K] (row stride ldx), W bf16 [N, K] (or
// [gate | up] [2I, K] for the SwiGLU epilogue), y [M, N] (or [M, I]) bf16 or fp32. K % (64 KP) == 0.
//
// Why a fourth GEMM: above 16 rows a decode step's GEMMs are cuBLAS's, whose kernels cannot start before the
// kernel ahead of them has finished (no programmatic-dependency wait: docs/performance/gemm.md, "Decode GEMMs on
// cuBLAS"). The cluster kernel of skinny_gemm.cu waits but its mma.sync consumers, one warp a scheduler, could not
// keep up with their stages ("The cluster GEMM, diagnosed"). Here one warpgroup issues each 16-column step of a
// stage as one wgmma per 64 weight rows, with both operands in shared memory where the tensor copies put them:
//   * a unit is R = 64 WT weight rows (the wgmma's M side; WT = 1 or 2 accumulators) times all NX (32 or 64) x
//     rows (its N side: "swap AB", no tensor-core row is spent on padding x rows beyond NX);
//   * stage layout, as tensor copies with the 128-byte swizzle write it: the weight box, [KC / 64 blocks][R rows]
//     [64 columns], then the x box, [KC / 64][NX][64]. Each block's rows start on a 1024-byte boundary and rows
//     lie 128 bytes apart, which is the canonical K-major layout of wgmma (mma.cuh): 8-row groups 1024 bytes
//     apart (the descriptors' stride offset), a 16-column step 32 bytes further along the row. One tensor copy
//     a stage for the weights and one for x (the host's maps: ops.skinny_wg);
//   * SwiGLU: the weight map is 5-D, (64 columns, 8 rows, gate | up, I / 8 groups, K / 64 blocks), so the box
//     lands each group's 8 gate rows and then its 8 up rows: a thread's D fragment holds rows g and g + 8 of its
//     warp's 16, the gate and the up row of one output column, as the other skinny kernels' fragments do, and
//     skinny_store writes silu(gate) * up with their rounding;
//   * split K (KP = 2, 4, 8): the KP CTAs of a thread-block cluster take the same unit, CTA r the columns
//     [r K / KP, (r + 1) K / KP). At the unit's end CTAs 1 .. KP - 1 send their fp32 partials into CTA 0's
//     shared memory by st.async, counted on CTA 0's "red" barrier; CTA 0 adds them to its own in rank order
//     (deterministic), stores, and frees its landing area with a remote arrival on each peer's "free" barrier;
//   * work: static. Cluster c (of G / KP) takes the units c, c + G / KP, ...; the host makes G / KP at most the
//     units, so every CTA has one;
//   * pipeline: warp 4 (lane 0) is the producer. Stage i's "full" barrier expects its weight and x boxes; its
//     "empty" barrier counts the four consumer warps. The weights of the first `pre` stages may be issued
//     before the PDL wait (no kernel writes them); x only after it. The consumers issue a stage's wgmmas as one
//     group and release the stage before it once all but that group are done (wgmma.wait_group 1);
//   * rows past N (or I) and x rows past M arrive as zeros (the maps' bounds) and are not stored;
//   * the add_rmsnorm between two GEMMs, folded into them (WT = 1 builds; ops.skinny_wg's residual= and norm=):
//     the GEMM before it takes the residual epilogue (EPI = kResidual). y is the residual stream, updated in place
//     as add_rmsnorm updates it (s = bf16(y + bf16(acc))); xw = bf16(s * nw) is the new stream times the norm's
//     weight, the x of the GEMM after it; and the squares of s are summed per x row over the unit's columns into
//     ssq[u][row] (lanes, then warps: a fixed order). The residual and the weight are loaded at the unit's start,
//     so the epilogue waits on no load. The GEMM after it takes the normed prologue (XN): each x row's 1 / rms from
//     the ssq parts (1 / sqrt(sum / K + eps), after the PDL wait, while x's copies fly), applied to the fp32
//     sums before the store (or the SwiGLU). So rms_norm(s) * nw times W is computed as (s * nw) W / rms: the
//     same product with the roundings in other places (DESIGN §4's default mode; the kernel checks hold it to
//     the flash rule against the composition).
// A thread's accumulators: acc[t][j][0..1] = (weight row 64 t + 16 w + g, x rows 8 j + 2 t4, + 1), acc[t][j][2..3]
// = (row + 8, the same x rows), w its warp, g = lane / 4, t4 = lane % 4.

#include <cuda_bf16.h>

#include "mma.cuh"
#include "norm.cuh"
#include "swiglu.cuh"
#include "pdl.cuh"
#include "skinny.cuh"
#include "tma.cuh"

// One chain of wgmmas a unit: each adds into the accumulators of the one before it. Two chains (the even and the odd
// 16-column steps) were not faster, in the engine on an H100 (sixty-first session: 1.073 ms a qwen3-0.6b batch-32 step
// against 1.067) nor alone (probe_mma.py's chains mode, sixty-second session), and the switch that built them is gone
// (docs/performance/decode_step.md, "The edge probe, the x copies and the MMA chain after the wait").

// The cluster's last barrier (sixty-second session; docs/performance/decode_step.md, "The MMA phase alone, and the wait
// ptxas injected"). A split-K kernel's CTAs meet at the end so that none leaves while a peer may still reach its
// shared memory. Arriving with .release (cluster_sync_all), every thread first waited until its global stores were
// performed at cluster scope: the trace's 0.7-1.1 us from a clustered CTA's stores to its end, against 0.03 without
// a cluster. So the barrier arrives .relaxed (cluster_sync_relaxed), and the last unit's arrivals on the peers' "free"
// barriers, which nobody waits on, are skipped: every other remote access (the partials' st.async) is waited on by
// its receiver before that receiver reaches the barrier, so none is in flight there. On an H100, qwen3-0.6b batch 32
// 1.030 / 1.030 ms a step against 1.039 / 1.041 with .release (two processes each, alternated). The build switch
// TK_WG_RELEASE_EXIT (the benches' A/B only) restores the .release barrier and the arrivals.
#ifdef TK_WG_RELEASE_EXIT
[[maybe_unused]] constexpr bool kRelaxedExit = false;
#else
[[maybe_unused]] constexpr bool kRelaxedExit = true;
#endif

// TK_WG_TRACE (a switch of benches/gpu/trace_wg.py): thread 0 of each CTA records %globaltimer (ns) at 7 marks --
// its start, its consumers' PDL wait passed, its first stage landed, its last unit's MMAs done, the fold done
// (the partials sent, for a gather's CTA other than 0), its stores done, its end -- and appends them with its SM,
// block, grid and kernel's shape to wg_trace (wg_trace_n counts; records past the capacity are dropped). Where a
// CTA fills each stage at most once (total <= S), the producer, once it has issued every copy, also watches the
// stages' full barriers in order and records when it sees each complete (record columns 10 .. 10 + S - 1, the rest
// 0): when the stages land, against when the consumers' MMAs are done (sixty-second session).
#ifdef TK_WG_TRACE
constexpr unsigned kWgTraceCap = 65536, kWgTraceCols = 18;
__device__ unsigned long long wg_trace[kWgTraceCap][kWgTraceCols];  // at namespace scope: found by name
__device__ unsigned int wg_trace_n;
#define TK_WG_MARK(k)                                                   \
  do {                                                                  \
    if (tid == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(wg_marks[k])); \
  } while (0)
#else
#define TK_WG_MARK(k) \
  do {                \
  } while (0)
#endif

namespace {

template <int J>
__device__ __forceinline__ void wgmma_ss(float (&d)[J][4], u64 desc_a, u64 desc_b, int acc);
#if defined(TK_WGMMA)
template <>
__device__ __forceinline__ void wgmma_ss<4>(float (&d)[4][4], u64 desc_a, u64 desc_b, int acc) {
  wgmma_ss_m64n32k16(d, desc_a, desc_b, acc);
}
template <>
__device__ __forceinline__ void wgmma_ss<8>(float (&d)[8][4], u64 desc_a, u64 desc_b, int acc) {
  wgmma_ss_m64n64k16(d, desc_a, desc_b, acc);
}
#endif

// the stage bytes and the landing area of the split-K partials (host twin: ops.skinny_wg_smem)
__host__ __device__ constexpr int wg_stage_bytes(int KC, int NX, int WT) { return (64 * WT + NX) * KC * 2; }
__host__ __device__ constexpr int wg_recv_bytes(int NX, int WT, int KP) { return (KP - 1) * 64 * WT * NX * 4; }

// kResidual's inputs of one thread for unit u, loaded at the unit's start: the residual values of its fragment
// elements (zero outside [M, N]) of the blocks j in [blo, bhi) this CTA stores, and the norm weight of its output
// columns
template <int WT, int J>
struct ResidualIn {
  __nv_bfloat16 r[WT][J][4];
  float w[WT][2];
};

template <int WT, int J>
__device__ __forceinline__ void residual_load(ResidualIn<WT, J>& in, const __nv_bfloat16* __restrict__ y,
                                              const __nv_bfloat16* __restrict__ nw, int u, int warp, int lane, int M,
                                              int N, int blo, int bhi) {
  const int gg = lane >> 2, tt = lane & 3;
#pragma unroll
  for (int t = 0; t < WT; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = (u * 4 * WT + 4 * t + warp) * 16 + gg + 8 * h;
      in.w[t][h] = n < N ? __bfloat162float(nw[n]) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = (u * 4 * WT + 4 * t + warp) * 16 + gg + 8 * (c >> 1), m = 8 * j + 2 * tt + (c & 1);
        const int b = t * J + j;
        in.r[t][j][c] = n < N && m < M && b >= blo && b < bhi ? y[(long long)m * N + n] : __float2bfloat16_rn(0.f);
      }
  }
}

// kResidual's store of unit u, for the x rows of the blocks j in [blo, bhi): y = s = bf16(y + bf16(acc)) in place
// (rmsnorm.cu's add_chunk rounding), xw = bf16(s * nw), and the squares of s summed per x row over the unit's
// columns into ssq[u * 64 + row] (over the lanes of a row, then the four warps in order)
template <int WT, int J>
__device__ __forceinline__ void residual_store(__nv_bfloat16* __restrict__ y, __nv_bfloat16* __restrict__ xw,
                                               const ResidualIn<WT, J>& in, const float (&acc)[WT][J][4], int u,
                                               int warp, int lane, int tid, int M, int N, float* __restrict__ ssq,
                                               float (&part)[4][64], int blo, int bhi) {
  const int gg = lane >> 2, tt = lane & 3;
#pragma unroll
  for (int j = 0; j < J; ++j) {  // x rows 8 j + 2 tt (+ 1): their sums finished before the next j's (registers)
    if (j < blo || j >= bhi) continue;
    float ss[2] = {0.f, 0.f};
#pragma unroll
    for (int t = 0; t < WT; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = (u * 4 * WT + 4 * t + warp) * 16 + gg + 8 * (c >> 1), m = 8 * j + 2 * tt + (c & 1);
        if (n < N && m < M) {
          const float a = __bfloat162float(__float2bfloat16_rn(acc[t][j][c]));
          const __nv_bfloat16 sb = __float2bfloat16_rn(__fadd_rn(__bfloat162float(in.r[t][j][c]), a));
          const float sv = __bfloat162float(sb);
          y[(long long)m * N + n] = sb;
          xw[(long long)m * N + n] = __float2bfloat16_rn(__fmul_rn(sv, in.w[t][c >> 1]));
          ss[c & 1] += sv * sv;
        }
      }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      float v = ss[b];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (gg == 0) part[warp][8 * j + 2 * tt + b] = v;
    }
  }
  asm volatile("bar.sync 2, 128;\n" ::: "memory");
  if (tid < M && tid >= 8 * blo && tid < 8 * bhi)
    ssq[u * 64 + tid] = ((part[0][tid] + part[1][tid]) + part[2][tid]) + part[3][tid];
  asm volatile("bar.sync 2, 128;\n" ::: "memory");  // part is free for the next unit
}

template <int KC, int S, int NX, int WT, int KP, bool F32, int EPI, bool XN, bool SP>
__device__ __forceinline__ void skinny_wg_impl(const TensorMap* wmap, const TensorMap* xmap, void* __restrict__ y,
                                               int M, int N, int K, int pre, int evict,
                                               const float* __restrict__ ssq_in, float* __restrict__ ssq_out,
                                               const __nv_bfloat16* __restrict__ nw, __nv_bfloat16* __restrict__ xw,
                                               int parts, float eps) {
  constexpr int kStage = wg_stage_bytes(KC, NX, WT);
  static_assert(KC % 64 == 0 && (NX == 32 || NX == 64) && (WT == 1 || WT == 2), "skinny_wg shapes");
  static_assert(KP == 1 || KP == 2 || KP == 4 || KP == 8, "skinny_wg split");
  static_assert(1024 + S * kStage + wg_recv_bytes(NX, WT, KP) + (XN ? 256 : 0) + (EPI == kResidual ? 1024 : 0) <=
                    227 * 1024 - 256, "skinny_wg: shared memory");
  static_assert(EPI != kResidual || (!F32 && !XN && WT == 1), "the residual epilogue stores bf16 of a plain x");
#if defined(TK_WGMMA)
  constexpr int R = 64 * WT, J = NX / 8;
  constexpr int kW = R * KC * 2;
  constexpr int kPart = WT * J * 128 * 16;  // one CTA's partials: [WT][J][128 threads][4 floats]
  // the spread fold: the unit's WT J fragment blocks (t, j), b = t J + j, OWN of them to each CTA of the cluster
  constexpr int NB = WT * J, OWN = SP ? NB / KP : NB;
  static_assert(!SP || (KP > 1 && NB % KP == 0), "the spread fold: a unit's blocks divided among the cluster");
  extern __shared__ __align__(128) unsigned char wg_smem[];  // up to 1 KB of slack, S stages, the landing area
  __shared__ __align__(8) u64 bars[2 * S + 2];             // full[s], empty[s], red, free
  __shared__ float rs_s[XN ? 64 : 1];                      // XN: each x row's 1 / rms
  __shared__ float part_s[EPI == kResidual ? 4 : 1][64];   // kResidual: the warps' sums of squares
  // the warp index through a shuffle: ptxas then knows it is warp-uniform, and the consumers' branch is not a
  // divergent path (where it would serialize the wgmmas: its advisory C7518)
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
#ifdef TK_WG_TRACE
  unsigned long long wg_marks[7] = {};
  __shared__ unsigned long long wg_land[8];  // the producer's sightings of the stages' first completions
  if (tid < 8) wg_land[tid] = 0ull;
  static_assert(S <= 8, "the trace's stage columns");
#endif
  TK_WG_MARK(0);
  const int outs = EPI == kSwiGLU ? R / 2 : R;  // output columns of a unit
  const int units = (N + outs - 1) / outs;
  const int clusters = (int)gridDim.x / KP, c = (int)blockIdx.x / KP;
  const u32 rank = KP > 1 ? cluster_rank() : 0u;
  const int blo = SP ? (int)rank * OWN : 0, bhi = blo + OWN;  // the blocks this CTA stores (all where gathered)
  const int kpart = K / KP, kch = (kpart + KC - 1) / KC;  // chunks of this CTA's columns (host: kpart % KC == 0
                                                          // when KP > 1; else the last chunk's columns past K are 0)
  const int mine = (units - 1 - c) / clusters + 1;        // units of this cluster (c < units: the host's grid)
  const int total = mine * kch;
  const u32 base = (smem_u32(wg_smem) + 1023u) & ~1023u;  // the swizzle's pattern repeats every 1024 bytes
  const u32 recv = base + S * kStage;
  const u32 bar_full = smem_u32(bars), bar_empty = bar_full + 8 * S, bar_red = bar_full + 16 * S,
            bar_free = bar_red + 8;
  if (warp == 4 && lane == 0) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(wmap)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(xmap)) : "memory");
  }
  if (tid == 0) {
    mbar_init_stages<S>(bar_full, bar_empty, 4);
    mbar_init(bar_red, 1);
    mbar_init(bar_free, SP ? KP - 1 : 1);  // spread: every peer frees what it received
    mbar_fence_init();
  }
  if constexpr (KP > 1)
    cluster_sync_all();  // the peers' barriers exist before any st.async or arrival reaches them
  else
    __syncthreads();

  if (warp == 4) {  // ---- producer: lane 0
    if (lane == 0) {
      const u64 policy = evict ? l2_evict_first() : 0ull;
      const int early = min(min(pre, S), total);
      auto weights = [&](int i) {  // stage i's weight box, and the bytes the stage expects (x's included)
        const int s = i % S, u = c + i / kch * clusters, kb = ((int)rank * kpart + i % kch * KC) / 64;
        mbar_expect_tx(bar_full + 8 * s, (u32)kStage);
        if constexpr (EPI == kSwiGLU)
          tensor_copy5(base + s * kStage, wmap, 0, 0, 0, u * (R / 16), kb, bar_full + 8 * s, policy, evict);
        else
          tensor_copy(base + s * kStage, wmap, 0, u * R, kb, bar_full + 8 * s, policy, evict);
      };
      for (int i = 0; i < early; ++i) weights(i);
      pdl_wait();  // x is the kernel before's output
      pdl_launch_dependents();
      for (int i = 0; i < total; ++i) {
        const int s = i % S, kb = ((int)rank * kpart + i % kch * KC) / 64;
        if (i >= early) {
          if (i >= S) mbar_wait(bar_empty + 8 * s, (u32)((i / S) + 1) & 1u);  // its previous use consumed
          weights(i);
        }
        tensor_copy(base + s * kStage + kW, xmap, 0, 0, kb, bar_full + 8 * s, 0ull, 0);
      }
#ifdef TK_WG_TRACE
      if (total <= S)  // every stage completes its phase 0 once, and no other: the watch cannot hang
        for (int s = 0; s < total; ++s) {
          mbar_wait(bar_full + 8 * s, 0u);
          asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(wg_land[s]));
        }
#endif
    }
    __syncwarp();
  } else {  // ---- consumers
    pdl_wait();
    pdl_launch_dependents();
    TK_WG_MARK(1);
    if constexpr (XN) {  // each x row's 1 / rms from the GEMM before's parts (ssq_in [parts][64])
      if (tid < NX) {
        float sum = 0.f;
        if (tid < M)
          for (int p = 0; p < parts; ++p) sum += ssq_in[p * 64 + tid];
        rs_s[tid] = tid < M ? inv_rms(sum, K, eps) : 0.f;
      }
      asm volatile("bar.sync 1, 128;\n" ::: "memory");
    }
    float acc[WT][J][4];
    [[maybe_unused]] ResidualIn<WT, J> rin;
    int i = 0;
    for (int uu = 0; uu < mine; ++uu) {
      const int u = c + uu * clusters;
      if constexpr (EPI == kResidual)  // the unit's residual and weight, waited on only in its epilogue
        if (KP == 1 || rank == 0 || SP)
          residual_load<WT, J>(rin, reinterpret_cast<const __nv_bfloat16*>(y), nw, u, warp, lane, M, N, blo, bhi);
      for (int kc = 0; kc < kch; ++kc, ++i) {
        const int s = i % S;
        const u32 st = base + s * kStage;
        mbar_wait(bar_full + 8 * s, (u32)(i / S) & 1u);
        if (i == 0) TK_WG_MARK(2);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < KC / 16; ++kk) {  // block kk / 4, 16-column step kk % 4 of it
          const u32 off = (u32)(kk >> 2) * 128u, step = (u32)(kk & 3) * 32u;
          const u64 db = wg_desc_sw128(st + kW + off * NX + step, 16, 1024);
#pragma unroll
          for (int t = 0; t < WT; ++t)
            wgmma_ss<J>(acc[t], wg_desc_sw128(st + off * R + t * 8192 + step, 16, 1024), db, kc > 0 || kk > 0);
        }
        wg_commit();
        wg_wait<1>();  // every group but this stage's has completed: the stage before is read
        __syncwarp();
        if (kc > 0 && lane == 0) mbar_arrive(bar_empty + 8 * ((i - 1) % S));
      }
      // ---- the end of unit u (s: its last stage). Outside the stages' loop, so that the loop's back edge
      // carries wgmma groups in flight only into more wgmmas: with this epilogue inside the loop, ptxas injected
      // a warpgroup wait at the back edge (advisory C7517), so no stage's wgmmas overlapped the next's (2.3% of
      // qwen3-0.6b's decode step on an H100; sixty-second session). build_check fails on that advisory.
      const int s = (i - 1) % S;
      wg_wait<0>();
      TK_WG_MARK(3);
#pragma unroll
      for (int t = 0; t < WT; ++t) wg_fence_regs<J>(acc[t]);
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty + 8 * s);
      if constexpr (KP > 1) {
        if constexpr (SP) {  // block b to CTA b / OWN, into its slot for this CTA; then fold what the peers sent here
          if (uu > 0) mbar_wait(bar_free, (u32)(uu - 1) & 1u);  // every peer has read the previous unit's
#pragma unroll
          for (int t = 0; t < WT; ++t)
#pragma unroll
            for (int j = 0; j < J; ++j) {
              const int b = t * J + j, q = b / OWN, slot = (int)rank < q ? (int)rank : (int)rank - 1;
              if (q != (int)rank)
                st_async_f4(recv + (u32)(slot * OWN + b % OWN) * 2048u + (u32)tid * 16u, bar_red, (u32)q,
                            acc[t][j][0], acc[t][j][1], acc[t][j][2], acc[t][j][3]);
            }
          if (tid == 0) mbar_expect_tx(bar_red, (u32)((KP - 1) * OWN * 2048));
          mbar_wait(bar_red, (u32)uu & 1u);
          const unsigned char* recv_p = wg_smem + (recv - smem_u32(wg_smem));
#pragma unroll
          for (int t = 0; t < WT; ++t)
#pragma unroll
            for (int j = 0; j < J; ++j) {
              const int b = t * J + j;
              if (b < blo || b >= bhi) continue;
              float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
              for (int p = 0; p < KP; ++p) {  // rank order, this CTA's own in its place: the gather's sums
                float4 v = make_float4(acc[t][j][0], acc[t][j][1], acc[t][j][2], acc[t][j][3]);
                if (p != (int)rank)
                  v = *reinterpret_cast<const float4*>(recv_p + ((p < (int)rank ? p : p - 1) * OWN + b % OWN) * 2048 +
                                                       tid * 16);
                if (p == 0) {
                  sum = v;
                } else {
                  sum.x += v.x;
                  sum.y += v.y;
                  sum.z += v.z;
                  sum.w += v.w;
                }
              }
              acc[t][j][0] = sum.x;
              acc[t][j][1] = sum.y;
              acc[t][j][2] = sum.z;
              acc[t][j][3] = sum.w;
            }
          asm volatile("bar.sync 1, 128;\n" ::: "memory");  // every consumer thread has read the landing area
          if (tid < KP - 1 && (!kRelaxedExit || uu + 1 < mine))
            mbar_arrive_peer(bar_free, (u32)(tid < (int)rank ? tid : tid + 1));
        } else if (rank != 0) {  // gather: send the partials to CTA 0 once it has read the previous ones
          if (uu > 0) mbar_wait(bar_free, (u32)(uu - 1) & 1u);
          const u32 dst = recv + ((u32)rank - 1u) * kPart + (u32)tid * 16u;
#pragma unroll
          for (int t = 0; t < WT; ++t)
#pragma unroll
            for (int j = 0; j < J; ++j)
              st_async_f4(dst + (u32)(t * J + j) * 2048u, bar_red, 0u, acc[t][j][0], acc[t][j][1], acc[t][j][2],
                          acc[t][j][3]);
          TK_WG_MARK(4);
          TK_WG_MARK(5);
          continue;
        } else {  // gather: CTA 0 folds the peers' partials
          if (tid == 0) mbar_expect_tx(bar_red, (u32)((KP - 1) * kPart));
          mbar_wait(bar_red, (u32)uu & 1u);
          const unsigned char* recv_p = wg_smem + (recv - smem_u32(wg_smem));
#pragma unroll
          for (int p = 1; p < KP; ++p)  // rank order
#pragma unroll
            for (int t = 0; t < WT; ++t)
#pragma unroll
              for (int j = 0; j < J; ++j) {
                const float4 v = *reinterpret_cast<const float4*>(recv_p + (p - 1) * kPart + (t * J + j) * 2048 + tid * 16);
                acc[t][j][0] += v.x;
                acc[t][j][1] += v.y;
                acc[t][j][2] += v.z;
                acc[t][j][3] += v.w;
              }
          asm volatile("bar.sync 1, 128;\n" ::: "memory");  // every consumer thread has read the landing area
          if (tid < KP - 1 && (!kRelaxedExit || uu + 1 < mine)) mbar_arrive_peer(bar_free, (u32)tid + 1u);
        }
      }
      TK_WG_MARK(4);
      if constexpr (EPI == kResidual) {
        residual_store<WT, J>(reinterpret_cast<__nv_bfloat16*>(y), xw, rin, acc, u, warp, lane, tid, M, N, ssq_out,
                              part_s, blo, bhi);
      } else {
        if constexpr (XN) {  // the rows' 1 / rms on the sums (x rows 8 j + 2 t4, + 1 of the fragment)
#pragma unroll
          for (int t = 0; t < WT; ++t)
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[t][j][e] *= rs_s[8 * j + 2 * (lane & 3) + (e & 1)];
        }
#pragma unroll
        for (int t = 0; t < WT; ++t)
#pragma unroll
          for (int j = 0; j < J; ++j)
            if (t * J + j >= blo && t * J + j < bhi)
              skinny_store<F32, EPI>(y, acc[t][j], u * (R / 16) + 4 * t + warp, 8 * j, lane, M, N);
      }
      TK_WG_MARK(5);
    }
  }
  if constexpr (KP > 1) {  // nobody leaves while a peer may still arrive on its barriers
    if constexpr (kRelaxedExit)
      cluster_sync_relaxed();
    else
      cluster_sync_all();
  }
#ifdef TK_WG_TRACE
  TK_WG_MARK(6);
  __syncthreads();  // the producer's sightings, seen by thread 0
  if (tid == 0) {
    const unsigned r = atomicAdd(&wg_trace_n, 1u);
    if (r < kWgTraceCap) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      for (int k = 0; k < 7; ++k) wg_trace[r][k] = wg_marks[k];
      wg_trace[r][7] = (unsigned long long)sm << 32 | (blockIdx.x << 8) | rank;
      wg_trace[r][8] = (unsigned long long)gridDim.x << 32 | (unsigned)N;
      wg_trace[r][9] = (unsigned long long)K << 32 | (unsigned)(EPI << 8 | (XN ? 16 : 0) | (F32 ? 32 : 0) |
                                                                 (SP ? 1 : 0));
      for (int k = 0; k < 8; ++k) wg_trace[r][10 + k] = wg_land[k];
    }
  }
#endif
#else
  __trap();  // an sm_90 build (optimized/kernels/__init__.py builds this file for sm_90a)
#endif
}

}  // namespace

// skinny_wg_k{KC}s{S}n{NX}t{WT}p{KP}_{bf16,f32,swiglu}: the kernel for M <= NX rows with chunks of KC columns,
// S stages, units of 64 WT weight rows, K split over clusters of KP CTAs; for WT = 1 also _res (the residual
// epilogue), _bf16n and _swiglun (the normed prologue); each with an _sp twin (the fold spread over the cluster)
// where the configuration has one. Grid: KP x (at most the units) CTAs of 160 threads
// (launched as clusters of KP), ops.skinny_wg_smem bytes of dynamic shared memory. wmap, xmap: the tensor maps
// ops.skinny_wg encodes; ssq_in, parts, eps: the normed prologue's; ssq_out, nw, xw: the residual epilogue's.
#define TK_WG_K(KCV, SV, NXV, WTV, KPV, SUF, F32V, EPIV, XNV, SPV)                                               \
  extern "C" __global__ void __launch_bounds__(160, 1) skinny_wg_k##KCV##s##SV##n##NXV##t##WTV##p##KPV##_##SUF( \
      const __grid_constant__ TensorMap wmap, const __grid_constant__ TensorMap xmap, void* __restrict__ y,      \
      int M, int N, int K, int pre, int evict, const float* __restrict__ ssq_in, float* __restrict__ ssq_out,    \
      const __nv_bfloat16* __restrict__ nw, __nv_bfloat16* __restrict__ xw, int parts, float eps) {               \
    skinny_wg_impl<KCV, SV, NXV, WTV, KPV, F32V, EPIV, XNV, SPV>(&wmap, &xmap, y, M, N, K, pre, evict, ssq_in,    \
                                                                 ssq_out, nw, xw, parts, eps);                    \
  }
#define TK_WG(KCV, SV, NXV, WTV, KPV)                                 \
  TK_WG_K(KCV, SV, NXV, WTV, KPV, bf16, false, kPlain, false, false)  \
  TK_WG_K(KCV, SV, NXV, WTV, KPV, f32, true, kPlain, false, false)    \
  TK_WG_K(KCV, SV, NXV, WTV, KPV, swiglu, false, kSwiGLU, false, false)
// ... with the split-K fold spread over the cluster (_sp; KP > 1 and the unit's blocks divided among the CTAs)
#define TK_WG_SP(KCV, SV, NXV, WTV, KPV)                                   \
  TK_WG_K(KCV, SV, NXV, WTV, KPV, bf16_sp, false, kPlain, false, true)     \
  TK_WG_K(KCV, SV, NXV, WTV, KPV, f32_sp, true, kPlain, false, true)       \
  TK_WG_K(KCV, SV, NXV, WTV, KPV, swiglu_sp, false, kSwiGLU, false, true)
// the folded add_rmsnorm's three kernels of a WT = 1 configuration (not (128, 3, 64, 8): its residual epilogue spills)
#define TK_WG_NORM(KCV, SV, NXV, KPV)                                 \
  TK_WG_K(KCV, SV, NXV, 1, KPV, res, false, kResidual, false, false)  \
  TK_WG_K(KCV, SV, NXV, 1, KPV, bf16n, false, kPlain, true, false)    \
  TK_WG_K(KCV, SV, NXV, 1, KPV, swiglun, false, kSwiGLU, true, false)
#define TK_WG_NORM_SP(KCV, SV, NXV, KPV)                                   \
  TK_WG_K(KCV, SV, NXV, 1, KPV, res_sp, false, kResidual, false, true)     \
  TK_WG_K(KCV, SV, NXV, 1, KPV, bf16n_sp, false, kPlain, true, true)       \
  TK_WG_K(KCV, SV, NXV, 1, KPV, swiglun_sp, false, kSwiGLU, true, true)
#define TK_WG_AND_SP(KCV, SV, NXV, WTV, KPV) TK_WG(KCV, SV, NXV, WTV, KPV) TK_WG_SP(KCV, SV, NXV, WTV, KPV)
#define TK_WG_NORM_AND_SP(KCV, SV, NXV, KPV) TK_WG_NORM(KCV, SV, NXV, KPV) TK_WG_NORM_SP(KCV, SV, NXV, KPV)
// (KC, S, NX, WT, KP): the stages that fit 227 KB with the landing area (ops.SKINNY_WG_CONFIGS); _AND_SP: with the
// spread fold's twins, where the configuration has them (ops.skinny_wg_spreads)
TK_WG(128, 8, 32, 1, 1)
TK_WG_AND_SP(128, 8, 32, 1, 2)
TK_WG_AND_SP(128, 8, 32, 1, 4)
TK_WG(128, 6, 32, 1, 8)
TK_WG(128, 6, 64, 1, 1)
TK_WG_AND_SP(128, 6, 64, 1, 2)
TK_WG_AND_SP(128, 5, 64, 1, 4)
TK_WG_AND_SP(128, 3, 64, 1, 8)
TK_WG(128, 5, 32, 2, 1)
TK_WG_AND_SP(128, 5, 32, 2, 2)
TK_WG_AND_SP(128, 4, 32, 2, 4)
TK_WG(128, 4, 64, 2, 1)
TK_WG_AND_SP(128, 3, 64, 2, 2)
TK_WG(128, 4, 32, 1, 1)  // 4 stages at 32 x rows: two CTAs a multiprocessor (ops.skinny_wg's stages=4)
TK_WG_AND_SP(128, 4, 32, 1, 4)
TK_WG_NORM(128, 8, 32, 1)
TK_WG_NORM_AND_SP(128, 8, 32, 2)
TK_WG_NORM_AND_SP(128, 8, 32, 4)
TK_WG_NORM(128, 6, 32, 8)
TK_WG_NORM(128, 6, 64, 1)
TK_WG_NORM_AND_SP(128, 6, 64, 2)
TK_WG_NORM_AND_SP(128, 5, 64, 4)
TK_WG_NORM(128, 4, 32, 1)
TK_WG_NORM_AND_SP(128, 4, 32, 4)
