// attention.cu -- paged attention kernels of the optimized engine.
//
// Reference twins: reference/attention.py
//   paged_prefill_d{16,32,64,128}, _d{64,128}_x2, _d128_wg{64,128} (wgmma, sm_90a) <-> paged_prefill
//   split_kv_partials_d{16,32,64,128} <-> split_kv_partials (and, with row_seq, invariant_attention)
//   split_kv_qk_partials_d{16,...}    <-> qk_norm_rope (+ its KV store), then split_kv_partials, one launch
//   split_kv_reduce                   <-> reduce_splits
//   merge_states                      <-> merge_states / merge_two (sorting and duplicate checks stay in Python)
//
// Layouts (shared with the reference):
//   q            bf16 [T, n_q, D]  (token row stride q_stride elements; heads and D contiguous)
//   k/v_cache    bf16 [num_blocks, block_size, n_kv, D]; token p of a sequence lives in page
//                block_table[p / block_size], slot p % block_size (any block_size >= 1: shifts and
//                masks when it is a power of two, an integer division otherwise)
//   block_tables int32 [B, max_blocks], -1 past a sequence's last block
//   seq_lens     int32 [B]
//   GQA: query head h reads KV head h / (n_q / n_kv).
//
// Tensor-core conventions (PTX ISA, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32):
//   g = lane >> 2 (groupID), t = lane & 3 (threadID_in_group)
//   A (16x16, row-major), 4 x .b32, each two bf16 (lower half = lower column):
//     a0: (row g,   cols 2t, 2t+1)    a1: (row g+8, cols 2t, 2t+1)
//     a2: (row g,   cols 2t+8, 2t+9)  a3: (row g+8, cols 2t+8, 2t+9)
//   B (16x8, "col"), 2 x .b32:  b0: (k 2t, 2t+1; n g)   b1: (k 2t+8, 2t+9; n g)
//   C/D (16x8 f32): c0,c1: (row g, cols 2t, 2t+1)   c2,c3: (row g+8, cols 2t, 2t+1)
//   => the C fragments of two adjacent 8-column tiles are, once packed to bf16, exactly the A
//      fragment of the 16-column k-step they cover (used for P in O += P V).
//   ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i; matrix i lands in register i;
//   without .trans a lane receives (row g, cols 2t, 2t+1) of each 8x8 matrix, with .trans
//   (rows 2t, 2t+1; col g).
//
// Shared-memory rows are padded to D + 8 bf16 (16 bytes) so that the 8 row addresses of one
// ldmatrix phase fall in 8 distinct 16-byte bank groups (no conflicts for D in {16, 32, 64, 128}).
//
// Fused RoPE (rope_in_attention, twin: reference gather_keys with rope_theta): when cos_t is not
// null the cache holds pre-RoPE keys, and each K tile is rotated in shared memory at its absolute
// key positions right after it lands, with the fp32 tables and the operation order of rope.cu's
// qk_norm_rope -- so the rotated keys are bitwise those the unfused path would have cached.
//
// NaN safety: stale cache slots (past seq_len, or unused pages) may hold NaN. K/V rows past the
// range a tile needs are never loaded (cp.async with its ignore-src operand zero-fills them), and every
// masked score is *selected* to -inf and its probability *selected* to exactly 0 -- a masked
// probability is never produced by arithmetic on a masked score.

#include <cuda_bf16.h>

#include "pdl.cuh"

#include "mma.cuh"

#include "mbarrier.cuh"

#include "qk_norm.cuh"

// Phase stamps of split_kv_partials (benches/gpu/trace_decode.py compiles this file with
// -DTK_DECODE_TRACE=N): thread 0 of CTA c < N writes the SM clock at each TRACE(i) to tk_decode_trace[c][i]
// and the global timer at the kernel's start and end to [c][8], [c][9]. Without the macro it compiles to
// nothing. (The array is at global scope, outside the anonymous namespace, so that its name is unmangled.)
#ifdef TK_DECODE_TRACE
__device__ unsigned long long tk_decode_trace[TK_DECODE_TRACE][10];
#endif

namespace {

#ifdef TK_DECODE_TRACE
__device__ __forceinline__ long long trace_cta() {
  return blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
}
__device__ __forceinline__ void trace_stamp(int i) {
  const long long c = trace_cta();
  if (threadIdx.x != 0 || c >= TK_DECODE_TRACE) return;
  tk_decode_trace[c][i] = clock64();
  if (i == 0 || i == 7) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    tk_decode_trace[c][i == 0 ? 8 : 9] = t;
  }
}
#define TRACE(i) trace_stamp(i)
#else
#define TRACE(i)
#endif

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xff800000u); }
__device__ __forceinline__ bool finite_f(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }

// 2^x with one MUFU instruction (what exp2f becomes under -ftz=true, which CuPy always passes)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The tile helpers below take shared-memory addresses as 32-bit integers (smem_u32 of the buffer):
// each lane computes its own offset once, and every fragment load is then that register plus a
// compile-time constant (an immediate of LDSM). With generic pointers the compiler rebuilt 64-bit
// addresses and converted them to the shared window on every tile.

// A fragments of a 16-row Q tile (rows of `row0`, all D columns) from padded shared memory.
template <int D>
__device__ __forceinline__ void load_q_frags(u32 (&qf)[D / 16][4], u32 sQ, int row0, int lane) {
  constexpr int LD = D + 8;
  const int mi = lane >> 3;
  const u32 base = sQ + ((row0 + ((mi & 1) << 3) + (lane & 7)) * LD + ((mi >> 1) << 3)) * 2;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], base + kk * 16 * 2);
}

// s[nt] (16 rows x 8 keys, nt < NKT) = Q (16 x D) . K^T for the NKT*8 keys starting at sK row 0.
template <int D, int NKT>
__device__ __forceinline__ void tile_scores(const u32 (&qf)[D / 16][4], u32 sK, int lane, float (&s)[NKT][4]) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int nt = 0; nt < NKT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  const int mi = lane >> 3;
  // matrices: (keys nt*8+0..7, dims kk*16+0..7), (same keys, dims +8), (keys +8, dims +0), (keys +8, dims +8)
  const u32 base = sK + ((((mi >> 1) << 3) + (lane & 7)) * LD + ((mi & 1) << 3)) * 2;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int nt = 0; nt < NKT; nt += 2) {
      u32 b0, b1, b2, b3;
      ldsm_x4(b0, b1, b2, b3, base + (nt * 8 * LD + kk * 16) * 2);
      mma_bf16(s[nt], qf[kk], b0, b1);
      mma_bf16(s[nt + 1], qf[kk], b2, b3);
    }
  }
}

// s[mt][nt] (16 rows x 8 keys, for MT tiles of 16 query rows at sQ rows row0 + 16*mt) = Q . K^T for the
// NKT*8 keys starting at sK row 0, the Q fragments read from shared memory one k-step at a time. Each
// K fragment is loaded once for the MT row tiles; every accumulator sees the same k-step order as
// tile_scores, so a row's scores are bitwise those of the one-tile path.
template <int D, int NKT, int MT>
__device__ __forceinline__ void tile_scores_sq(u32 sQ, int row0, u32 sK, int lane, float (&s)[MT][NKT][4]) {
  constexpr int LD = D + 8;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NKT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
  const int mi = lane >> 3;
  const u32 qbase = sQ + ((row0 + ((mi & 1) << 3) + (lane & 7)) * LD + ((mi >> 1) << 3)) * 2;
  const u32 kbase = sK + ((((mi >> 1) << 3) + (lane & 7)) * LD + ((mi & 1) << 3)) * 2;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    u32 qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldsm_x4(qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], qbase + (16 * mt * LD + kk * 16) * 2);
#pragma unroll
    for (int nt = 0; nt < NKT; nt += 2) {
      u32 b0, b1, b2, b3;
      ldsm_x4(b0, b1, b2, b3, kbase + (nt * 8 * LD + kk * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(s[mt][nt], qa[mt], b0, b1);
        mma_bf16(s[mt][nt + 1], qa[mt], b2, b3);
      }
    }
  }
}

// o[mt] (16 rows x D) += P[mt] (16 x NKT*8, fp32 probabilities in C layout) . V (NKT*8 keys from sV
// row 0), for MT row tiles sharing each V fragment load.
template <int D, int NKT, int MT>
__device__ __forceinline__ void tile_pv_mt(const float (&p)[MT][NKT][4], u32 sV, int lane, float (&o)[MT][D / 8][4]) {
  constexpr int LD = D + 8;
  const int mi = lane >> 3;
  // matrices (transposed): (keys +0..7, dims nt*8+0..7), (keys +8, dims +0), (keys +0, dims +8), (keys +8, dims +8)
  const u32 base = sV + ((((mi & 1) << 3) + (lane & 7)) * LD + ((mi >> 1) << 3)) * 2;
#pragma unroll
  for (int kk = 0; kk < NKT / 2; ++kk) {
    u32 a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = pack_bf16(p[mt][2 * kk][0], p[mt][2 * kk][1]);          // row g,   keys 2t, 2t+1
      a[mt][1] = pack_bf16(p[mt][2 * kk][2], p[mt][2 * kk][3]);          // row g+8, keys 2t, 2t+1
      a[mt][2] = pack_bf16(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);  // row g,   keys 2t+8, 2t+9
      a[mt][3] = pack_bf16(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);  // row g+8, keys 2t+8, 2t+9
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; nt += 2) {
      u32 b0, b1, b2, b3;
      ldsm_x4_t(b0, b1, b2, b3, base + (kk * 16 * LD + nt * 8) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(o[mt][nt], a[mt], b0, b1);
        mma_bf16(o[mt][nt + 1], a[mt], b2, b3);
      }
    }
  }
}

// o (16 rows x D) += P (16 x NKT*8) . V: the one-tile case
template <int D, int NKT>
__device__ __forceinline__ void tile_pv(const float (&p)[NKT][4], u32 sV, int lane, float (&o)[D / 8][4]) {
  tile_pv_mt<D, NKT, 1>(reinterpret_cast<const float(&)[1][NKT][4]>(p), sV, lane,
                        reinterpret_cast<float(&)[1][D / 8][4]>(o));
}

// Fold x[0..N) with op as a pairwise tree ((x0 op x1) op (x2 op x3)) ...: depth log2(N) instead of a
// chain of N - 1 dependent instructions. Overwrites x.
template <int N, typename Op>
__device__ __forceinline__ float tree_fold(float (&x)[N], Op op) {
#pragma unroll
  for (int w = 1; w < N; w *= 2)
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) x[i] = op(x[i], x[i + w]);
  return x[0];
}

// O *= alpha per row: the rescale of an online-softmax step. Skipped unless some row of the warp changed
// its maximum (alpha == 1 everywhere: the products would be the identity, so skipping them changes no
// bit; on long rows most tiles skip; for the same reason a tile whose alphas are all 1 may be rescaled
// with the others).
template <int D, int MT>
__device__ __forceinline__ void rescale_o(const float (&alphas)[MT][2], float (&o)[MT][D / 8][4]) {
  bool moved = false;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) moved |= alphas[mt][0] != 1.f || alphas[mt][1] != 1.f;
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        o[mt][nt][0] *= alphas[mt][0];
        o[mt][nt][1] *= alphas[mt][0];
        o[mt][nt][2] *= alphas[mt][1];
        o[mt][nt][3] *= alphas[mt][1];
      }
    }
  }
}

// One online-softmax step for the rows this thread holds in MT row tiles (h = 0: row g, h = 1: row
// g+8 of tile mt). s: raw scores of NKT*8 keys starting at absolute key position kv0 (+ the thread's
// column offset), visible iff key <= lim[mt][h] (lim < 0: nothing visible). On return s holds
// exact-0-or-exp2 probabilities. m_ is kept in the log2 domain (scores scaled by sl2 = scale*log2(e) >
// 0, so the raw maximum scales to the scaled one); p = 2^(s*sl2 - m) is one FFMA and one MUFU.EX2.
// MASKED = false (every key of the tile visible to every row of the warp) drops the per-element
// select of the masked path. The bits are the same either way: for a visible key the select keeps the
// score, and the one input the masked path treats apart, a score of -inf, gives 2^(-inf) = 0 in both.
// The MT tiles' chains are independent, in one basic block: the scheduler interleaves them.
// DEFER (the wgmma kernels): O is not touched; the factors it is to be scaled by go to alphas_out and
// rescale_o applies them later (there the scaling waits for the previous tile's P V, which runs on the
// tensor cores meanwhile).
template <int D, int NKT, int MT, bool MASKED, bool DEFER = false>
__device__ __forceinline__ void online_softmax_step(float (&s)[MT][NKT][4], int kv0, const int (&lim)[MT][2],
                                                    float sl2, int lane, float (&m_)[MT][2], float (&l_)[MT][2],
                                                    float (&o)[MT][D / 8][4], float (&alphas_out)[MT][2]) {
  const int c0 = kv0 + 2 * (lane & 3);
  float alphas[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float t[NKT];  // per 8-key tile: the pair max, later the pair sum (pairwise trees: short dependency chains)
#pragma unroll
      for (int nt = 0; nt < NKT; ++nt) {
        if (MASKED) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = c0 + nt * 8 + e;
            s[mt][nt][2 * h + e] = (key <= lim[mt][h]) ? s[mt][nt][2 * h + e] : neg_inf();  // masked: selected away
          }
        }
        t[nt] = fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
      }
      float mx = tree_fold<NKT>(t, [](float x, float y) { return fmaxf(x, y); });
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_[mt][h], mx * sl2);
      const float m_use = (m_new == neg_inf()) ? 0.f : m_new;  // never -inf - -inf
      const float alpha = fast_exp2(m_[mt][h] - m_use);        // 0 while the row has seen nothing
      m_[mt][h] = m_new;
#pragma unroll
      for (int nt = 0; nt < NKT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = s[mt][nt][2 * h + e];
          // masked -> exactly 0, never arithmetic on a masked score
          s[mt][nt][2 * h + e] = (MASKED && v == neg_inf()) ? 0.f : fast_exp2(fmaf(v, sl2, -m_use));
        }
        t[nt] = s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
      }
      const float rs = tree_fold<NKT>(t, [](float x, float y) { return x + y; });
      l_[mt][h] = l_[mt][h] * alpha + rs;
      alphas[mt][h] = alpha;
    }
  }
  if constexpr (DEFER) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) alphas_out[mt][0] = alphas[mt][0], alphas_out[mt][1] = alphas[mt][1];
    return;
  }
  rescale_o<D, MT>(alphas, o);
}

// online_softmax_step, the unmasked code when no key of the tile is hidden from any row of the warp
// (a warp-uniform branch: most tiles of a long row, every tile of a decode split but its last).
template <int D, int NKT, int MT, bool DEFER = false>
__device__ __forceinline__ void online_softmax(float (&s)[MT][NKT][4], int kv0, const int (&lim)[MT][2], float sl2,
                                               int lane, float (&m_)[MT][2], float (&l_)[MT][2],
                                               float (&o)[MT][D / 8][4], float (&alphas_out)[MT][2]) {
  bool full = true;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) full &= kv0 + NKT * 8 - 1 <= min(lim[mt][0], lim[mt][1]);
  if (__all_sync(0xffffffffu, full))
    online_softmax_step<D, NKT, MT, false, DEFER>(s, kv0, lim, sl2, lane, m_, l_, o, alphas_out);
  else
    online_softmax_step<D, NKT, MT, true, DEFER>(s, kv0, lim, sl2, lane, m_, l_, o, alphas_out);
}

// K/V tiles are copied in two steps. First, one thread per key row looks the row's page up in the
// block table and writes the offset of its cache slot to a small shared table (row_offset,
// tile_row_offsets); the kernels fill a tile's table two tiles ahead, the page read at the top of an
// iteration and the entry written at its end, so the block-table load is off the copy's path and its
// round trip overlaps the tile's work (read at the end, it held the iteration's closing barrier). Then every thread issues the cp.async copies of its 16-byte
// chunks of the tile's rows from that table (load_kv_tile). Looking the page up in each of the D/8
// copiers of a row, with the 64-bit product and the block-size branch, cost ~35 instructions per row
// and thread, a fifth of the prefill kernel's instructions. The table holds 32-bit offsets in units of
// 16 bytes (the host checks that a cache's 16-byte chunks are numbered within int32): a copier turns
// one into its two addresses with two wide multiply-adds, where 64-bit byte offsets took a select and
// two 64-bit additions per row.

// Offset, in 16-byte chunks (8 bf16), of the cache slot of key position pos on page `page` (its block
// index blk), or -1 (zero-fill) at pos >= kv_end or on a missing page. A slot is
// page * block_size * n_kv * D + slot * n_kv * D elements into the cache; D % 8 == 0.
__device__ __forceinline__ int slot_chunk(int page, int pos, int blk, int kv_end, int n_kv, int D, int block_size) {
  if (pos >= kv_end || page < 0) return -1;
  return page * (block_size * n_kv * (D / 8)) + (pos - blk * block_size) * (n_kv * (D / 8));
}

// block index of key position pos: bs_log2 = log2(block_size) for a power of two (a shift), else -1 (a
// division)
__device__ __forceinline__ int block_of(int pos, int block_size, int bs_log2) {
  return bs_log2 >= 0 ? pos >> bs_log2 : pos / block_size;
}

// The page of key position pos (-1 at pos >= kv_end, where nothing is read)
__device__ __forceinline__ int row_page(const int* __restrict__ bt, int pos, int kv_end, int block_size, int bs_log2) {
  return pos < kv_end ? bt[block_of(pos, block_size, bs_log2)] : -1;
}

// slot_chunk of key position pos, its page looked up in the block table bt
__device__ __forceinline__ int row_offset(const int* __restrict__ bt, int pos, int kv_end, int n_kv, int D,
                                          int block_size, int bs_log2) {
  return slot_chunk(row_page(bt, pos, kv_end, block_size, bs_log2), pos, block_of(pos, block_size, bs_log2), kv_end,
                    n_kv, D, block_size);
}

// The tables of the two tiles at kv0 and kv0 + BN (s_off[0], s_off[1]), one row per thread; the caller
// adds the barrier.
template <int BN, int THREADS>
__device__ __forceinline__ void tile_row_offsets(int (&s_off)[2][BN], const int* __restrict__ bt, int kv0, int kv_end,
                                                 int n_kv, int D, int block_size, int bs_log2, int tid) {
  static_assert(THREADS >= 2 * BN, "one thread per row of the two tiles");
  if (tid < 2 * BN) s_off[tid / BN][tid % BN] = row_offset(bt, kv0 + tid, kv_end, n_kv, D, block_size, bs_log2);
}

// Issue the cp.async copies of one K/V tile (BN key rows of KV head kvh) from its row-offset table
// (s_off[r]: 16-byte chunk index of row r's cache slot, -1: zero-fill, read nothing). Each thread copies
// 16-byte chunk c of rows r0, r0 + RSTEP, ...: a compile-time count of rows, straight-line code with
// constant shared-memory offsets; per row one shared load, a compare, a max, two wide multiply-adds and
// the two copies. EXCEPT: row `except` (if any) is left alone, neither copied nor zero-filled (the fused
// decode attention writes this step's new key there itself, split_kv_partials_impl<D, true>).
template <int D, int BN, int THREADS, bool L1 = false, bool EXCEPT = false>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* sK, __nv_bfloat16* sV,
                                             const __nv_bfloat16* __restrict__ k_cache,
                                             const __nv_bfloat16* __restrict__ v_cache, const int* s_off, int kvh,
                                             int tid, int except = -1) {
#ifndef TK_DIAG_SMEM64
  constexpr int LD = D + 8;
#else
  constexpr int LD = D;  // (the diagnostic 64 KB decode build's unpadded rows: DecodeCfg)
#endif
  constexpr int CH = D / 8;
  constexpr int RSTEP = THREADS / CH;
  constexpr int ROWS = (BN + RSTEP - 1) / RSTEP;
  static_assert(THREADS % CH == 0, "threads must cover whole rows");
  const int c = tid % CH, r0 = tid / CH;
  const uint4* kb = reinterpret_cast<const uint4*>(k_cache + (kvh * D + c * 8));
  const uint4* vb = reinterpret_cast<const uint4*>(v_cache + (kvh * D + c * 8));
  const u32 dk = smem_u32(sK + r0 * LD + c * 8), dv = smem_u32(sV + r0 * LD + c * 8);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int r = r0 + i * RSTEP;
    if (BN % RSTEP != 0 && r >= BN) break;
    if constexpr (EXCEPT)
      if (r == except) continue;
    const int o = s_off[r];
    const bool skip = o < 0;
    const u32 off = (u32)max(o, 0);  // a skipped copy still gets an address inside the cache
    cp_async16_or_zero<L1>(dk + i * RSTEP * LD * 2, kb + off, skip);
    cp_async16_or_zero<L1>(dv + i * RSTEP * LD * 2, vb + off, skip);
  }
}

#ifdef TK_DIAG_REGLOAD
// (The copies-only diagnostic build's switch, off by default.) load_kv_tile through registers: each thread
// loads its 16-byte chunks of the tile's rows (the same rows and chunk as load_kv_tile's copies) with
// 128-bit global loads (ld.global.nc), the zero-filled rows as zeros; sts_kv_tile stores them where
// load_kv_tile's copies would have written them. (A kernel built this way, one tile ahead in registers,
// was 9-12% slower than the cp.async copies: docs/performance/decode_attention.md, "K/V tiles through registers".)
__device__ __forceinline__ uint4 ldg_kv16(const uint4* p) {
  uint4 x;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "l"(p));
  return x;
}
template <int D, int BN, int THREADS>
struct KvRegs {
  static constexpr int ROWS = (BN + THREADS / (D / 8) - 1) / (THREADS / (D / 8));
  uint4 k[ROWS], v[ROWS];
};
template <int D, int BN, int THREADS>
__device__ __forceinline__ void ldg_kv_tile(KvRegs<D, BN, THREADS>& t, const __nv_bfloat16* __restrict__ k_cache,
                                            const __nv_bfloat16* __restrict__ v_cache, const int* s_off, int kvh,
                                            int tid) {
  constexpr int CH = D / 8, RSTEP = THREADS / CH, ROWS = KvRegs<D, BN, THREADS>::ROWS;
  static_assert(BN % RSTEP == 0, "whole rows a thread");
  const int c = tid % CH, r0 = tid / CH;
  const uint4* kb = reinterpret_cast<const uint4*>(k_cache + (kvh * D + c * 8));
  const uint4* vb = reinterpret_cast<const uint4*>(v_cache + (kvh * D + c * 8));
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int o = s_off[r0 + i * RSTEP];
    const u32 off = (u32)max(o, 0);
    t.k[i] = ldg_kv16(kb + off);
    t.v[i] = ldg_kv16(vb + off);
    if (o < 0) t.k[i] = t.v[i] = make_uint4(0, 0, 0, 0);
  }
}
template <int D, int BN, int THREADS, int LD>  // LD: the tile's row stride (DecodeCfg's)
__device__ __forceinline__ void sts_kv_tile(const KvRegs<D, BN, THREADS>& t, __nv_bfloat16* sK, __nv_bfloat16* sV,
                                            int tid) {
  constexpr int CH = D / 8, RSTEP = THREADS / CH, ROWS = KvRegs<D, BN, THREADS>::ROWS;
  const int c = tid % CH, r0 = tid / CH;
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    *reinterpret_cast<uint4*>(sK + (r0 + i * RSTEP) * LD + c * 8) = t.k[i];
    *reinterpret_cast<uint4*>(sV + (r0 + i * RSTEP) * LD + c * 8) = t.v[i];
  }
}
#endif

// ---- The wgmma prefill kernels' K/V tiles (paged_prefill_d128_wg*) -------------------------------
// A tile of BN keys x D dims is stored in the 128-byte-swizzled layout of wgmma (mma.cuh): D/64 slabs of
// BN rows x 128 bytes (64 dims of a key), slab h at h * BN * 128 bytes; within a slab, row r at r * 128
// and its 16-byte chunk k (dims 8k..8k+7 of the slab) at position k ^ (r % 8). Element (key r, dim c):
//   (c / 64) * 64 BN + r * 64 + ((c / 8 % 8) ^ (r % 8)) * 8 + c % 8.
// The one layout serves both products: as the K-major B of S = Q K^T (N = keys: 8-row groups 1024 bytes
// apart; a 16-dim k-step 32 bytes further along a row, the next slab after four) and as the MN-major B
// of O += P V (N = dims: the slabs, BN * 128 bytes apart; K = keys: 8-row groups 1024 bytes apart).
// The buffers start on 1024-byte boundaries (the swizzle pattern's period; the kernel aligns them).
template <int D, int BN>
__device__ __forceinline__ int kv_sw_index(int r, int c) {
  return (c >> 6) * (BN * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

// load_kv_tile into the swizzled layout: a warp copies 4 half-rows (128 bytes of one key each) per step,
// lane (lane >> 3, lane & 7) chunk lane & 7 of the step's half-row lane >> 3: each step reads four
// 128-byte runs of the cache and fills four whole 128-byte rows of shared memory (conflict-free).
template <int D, int BN, int THREADS>
__device__ __forceinline__ void load_kv_tile_sw(u32 sK, u32 sV, const __nv_bfloat16* __restrict__ k_cache,
                                                const __nv_bfloat16* __restrict__ v_cache, const int* s_off, int kvh,
                                                int tid) {
  constexpr int SLABS = D / 64, WARPS = THREADS / 32, STEPS = BN / 4 * SLABS;
  static_assert(D % 64 == 0 && BN % 4 == 0 && STEPS % WARPS == 0, "whole 4-row steps per warp");
  const int lane = tid & 31;
  const uint4* kb = reinterpret_cast<const uint4*>(k_cache + kvh * D);
  const uint4* vb = reinterpret_cast<const uint4*>(v_cache + kvh * D);
#pragma unroll
  for (int st = tid >> 5; st < STEPS; st += WARPS) {
    const int key = (st / SLABS) * 4 + (lane >> 3), ch = (st % SLABS) * 8 + (lane & 7);  // chunk of 8 dims
    const int o = s_off[key];
    const bool skip = o < 0;
    const u32 off = (u32)max(o, 0) + ch;  // a skipped copy still gets an address inside the cache
    const u32 dst = (u32)(kv_sw_index<D, BN>(key, ch * 8) * 2);
    cp_async16_or_zero(sK + dst, kb + off, skip);
    cp_async16_or_zero(sV + dst, vb + off, skip);
  }
}

#ifdef TK_WGMMA
// Issue s (this warp's 16 rows x BN keys, tile_scores' layout) = Q . K^T for the warpgroup's 64 rows as
// one commit group: the Q fragments in registers (load_q_frags), K from a swizzled tile at sK, D/16
// wgmma k-steps chained in the same order as tile_scores' MMAs (which is why the bits are theirs). s
// is the asynchronous MMAs' until a wg_wait covers the group.
template <int D, int BN>
__device__ __forceinline__ void tile_scores_wg(const u32 (&qf)[D / 16][4], u32 sK, float (&s)[BN / 8][4]) {
  static_assert(D == 128 && BN == 64, "the m64n64k16 product of a 64-key tile, 128 dims");
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  wg_fence_regs(s);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const u64 desc = wg_desc_sw128(sK + (kk >> 2) * BN * 128 + (kk & 3) * 32, 16, 1024);  // dims 16kk..
    if (kk == 0)
      wgmma_m64n64k16<0>(s, qf[kk], desc);
    else
      wgmma_m64n64k16<1>(s, qf[kk], desc);
  }
  wg_commit();
}

// P (this warp's 16 rows x BN keys, fp32 probabilities in C layout) as the A fragments of the BN/16
// k-steps of P V (bf16)
template <int BN>
__device__ __forceinline__ void pack_p(const float (&p)[BN / 8][4], u32 (&a)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    a[kk][0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);          // row g,   keys 2t, 2t+1
    a[kk][1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);          // row g+8, keys 2t, 2t+1
    a[kk][2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);  // row g,   keys 2t+8, 2t+9
    a[kk][3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);  // row g+8, keys 2t+8, 2t+9
  }
}

// Issue o (this warp's 16 rows x D) += P . V for the warpgroup's 64 rows as one commit group, P as
// pack_p's fragments, V from a swizzled tile at sV (transposed B): BN/16 wgmma k-steps in key order.
// o and a are the asynchronous MMAs' until a wg_wait covers the group.
template <int D, int BN>
__device__ __forceinline__ void tile_pv_wg(const u32 (&a)[BN / 16][4], u32 sV, float (&o)[D / 8][4]) {
  static_assert(D == 128 && BN % 16 == 0, "the m64n128k16 product, 128 dims");
  wg_fence_regs(o);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_m64n128k16_tb(o, a[kk], wg_desc_sw128(sV + kk * 2048, BN * 128, 1024));
  wg_commit();
}

// The wgmma kernels' softmax of one tile: this thread's rows' limits and running state from shared
// memory, the online-softmax step with O's rescale left to the caller (alphas), the state back.
template <int D, int BN, int THREADS>
__device__ __forceinline__ void softmax_tile_deferred(float (&s)[1][BN / 8][4], int kv0, const int* s_lim,
                                                      float (&s_m)[1][2][THREADS], float (&s_l)[1][2][THREADS],
                                                      int row0, int lane, int tid, float sl2, float (&o)[1][D / 8][4],
                                                      float (&alphas)[1][2]) {
  int lim[1][2];
  float m2[1][2], l2[1][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lim[0][h] = s_lim[row0 + (lane >> 2) + 8 * h];
    m2[0][h] = s_m[0][h][tid];
    l2[0][h] = s_l[0][h][tid];
  }
  online_softmax<D, BN / 8, 1, true>(s, kv0, lim, sl2, lane, m2, l2, o, alphas);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    s_m[0][h][tid] = m2[0][h];
    s_l[0][h][tid] = l2[0][h];
  }
}
#endif  // TK_WGMMA

// log2(x) for a power of two, -1 for any other block size
__device__ __forceinline__ int block_shift(int x) { return (x & (x - 1)) == 0 ? __ffs(x) - 1 : -1; }

// Row i (< BM) of a prefill tile's token table (the tile's first token t0) into s_seq[i], s_pos[i]: the token's
// sequence and position, or -1, -1 for a row past the tile's TT tokens or past T, a padding row (q_pos < 0) or a
// sequence index out of range.
__device__ __forceinline__ void token_row(int* s_seq, int* s_pos, const int* q_seq_idx, const int* q_pos, int t0,
                                          int i, int TT, int T, int B) {
  int sq = -1, ps = -1;
  if (i < TT && t0 + i < T) {
    ps = q_pos[t0 + i];
    sq = q_seq_idx[t0 + i];
    if (ps < 0 || sq < 0 || sq >= B) sq = ps = -1;
  }
  s_seq[i] = sq;
  s_pos[i] = ps;
}

// Fused RoPE: rotate the K rows [kv0, kv_end) of a tile in shared memory (rotate-half, fp32 tables
// cos_t / sin_t [max_pos, D/2]; a position outside the table is left as it is, like qk_norm_rope).
// The caller brackets it with CTA barriers (the tile has landed / the rotation is visible).
// SW = true: the tile is in the swizzled layout (kv_sw_index, the wgmma kernels') instead of padded rows.
template <int D, int BN, int THREADS, bool SW = false>
__device__ __forceinline__ void rotate_k_tile(__nv_bfloat16* sK, int kv0, int kv_end, const float* __restrict__ cos_t,
                                              const float* __restrict__ sin_t, int max_pos, int tid) {
  constexpr int LD = D + 8, HALF = D / 2;
  for (int i = tid; i < BN * HALF; i += THREADS) {
    const int r = i / HALF, j = i - r * HALF;
    const int p = kv0 + r;
    if (p < kv_end && p < max_pos) {
      const int ia = SW ? kv_sw_index<D, BN>(r, j) : r * LD + j;
      const int ib = SW ? kv_sw_index<D, BN>(r, j + HALF) : r * LD + j + HALF;
      const float ya = __bfloat162float(sK[ia]);
      const float yb = __bfloat162float(sK[ib]);
      const float cs = cos_t[(long long)p * HALF + j];
      const float sn = sin_t[(long long)p * HALF + j];
      sK[ia] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(ya, cs), __fmul_rn(-yb, sn)));
      sK[ib] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(yb, cs), __fmul_rn(ya, sn)));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// paged_prefill
//
// Math (twin: reference paged_prefill): query t of sequence b at position p attends keys 0..p of b:
//   out[t, h] = sum_j softmax_j(scale * q[t, h] . k[b, j]) v[b, j],   j <= p (j < seq_len[b])
// Padding rows (q_pos < 0, or a sequence index outside [0, B)) write zeros and read nothing.
//
// CTA = (tile of TT = BM / G consecutive query tokens, one KV head). Its BM rows (64, or 128 for the
// _x2 kernels) are token-major (row r <-> token t0 + r / G, query head kvh*G + r % G), so GQA heads
// sharing the KV head read each K/V tile once. 4 warps of 16 rows (or, _x2, of two 16-row tiles);
// keys in tiles of BN = 64, double-buffered through cp.async; S = Q K^T and O += P V
// on tensor cores; flash-attention-2 online softmax in fp32 (tiles entirely visible to a thread's
// rows skip the per-element mask, and a warp whose maxima did not move skips the rescale of O).
// The tokens of one CTA may belong to several sequences: the CTA runs one pass per distinct
// sequence (in increasing index order), rows of other sequences fully masked in that pass, so no
// layout of q_seq_idx can make a row read another sequence. A sequence's rows need not be
// contiguous for correctness; contiguous rows (a chunk per sequence) keep passes to ~1 per CTA.
// Heavy tiles (late in T) are scheduled first (the kernel's first lines: in which order across KV heads).
// ------------------------------------------------------------------------------------------------
// (r / G, r % G) for r = r0, r0 + step, r0 + 2 * step, ...: two divisions at the start, then an add and
// a compare per step (the row -> (token, query head) map of a token-major tile; G is a runtime value).
struct RowStep {
  int tt, g, dq, dr, G;
  __device__ __forceinline__ RowStep(int r0, int step, int G_) : G(G_) {
    tt = r0 / G_;
    g = r0 - tt * G_;
    dq = step / G_;
    dr = step - dq * G_;
  }
  // step on; true when g wrapped (tt took one more than dq)
  __device__ __forceinline__ bool next() {
    tt += dq;
    g += dr;
    const bool wrap = g >= G;
    if (wrap) {
      g -= G;
      ++tt;
    }
    return wrap;
  }
};

// The Q tile of a prefill CTA -> sQ [BM][D + 8] by cp.async, THREADS threads (this one: tid). Row r is
// token t0 + r / G, query head kvh * G + r % G; rows of padding, of a token past T or of no valid sequence
// (s_pos < 0) are zero-filled. The caller commits the group.
template <int D, int BM, int THREADS>
__device__ __forceinline__ void load_q_tile(__nv_bfloat16* sQ, const __nv_bfloat16* __restrict__ q, int q_stride,
                                            const int* s_pos, int t0, int kvh, int G, int tid) {
  constexpr int LD = D + 8, CH = D / 8;
  // thread: chunk c of rows r0, r0 + QS, ...; each row's (token, head) = (r / G, r % G) stepped, not divided
  constexpr int QS = THREADS / CH;
  static_assert(THREADS % CH == 0 && BM % QS == 0, "whole rows per sweep, whole sweeps per tile");
  const int c = tid % CH, r0 = tid / CH;
  RowStep rg(r0, QS, G);
  // element offset of (token t0 + tt, head kvh * G + g, chunk c) in q, stepped with (tt, g)
  long long off = (long long)(t0 + rg.tt) * q_stride + (kvh * G + rg.g) * D + c * 8;
  const long long step = (long long)rg.dq * q_stride + rg.dr * D, wrap = (long long)q_stride - G * D;
  u32 dst = smem_u32(sQ + r0 * LD + c * 8);
#pragma unroll 4
  for (int r = r0; r < BM; r += QS, dst += QS * LD * 2) {
    const bool ok = s_pos[rg.tt] >= 0;  // (-1 for every token index >= TT: r < rows_used is implied)
    cp_async16_or_zero(dst, q + (ok ? off : 0), !ok);
    off += step;
    if (rg.next()) off += wrap;
  }
}

// A prefill warp's epilogue: normalise its 16 * MT rows of O by their running sums (this thread's slots
// of s_l), stage them (bf16) in its own rows of sQ, then 16-byte stores to out [T, n_q, D]. Only this warp
// reads and writes those rows of sQ; the caller makes sure nothing else still reads them.
template <int D, int MT, int THREADS>
__device__ __forceinline__ void store_out_rows(const float (&o)[MT][D / 8][4], const float (&s_l)[MT][2][THREADS],
                                               __nv_bfloat16* sQ, __nv_bfloat16* __restrict__ out, int tid, int row0,
                                               int lane, int rows_used, int t0, int T, int n_q, int kvh, int G) {
  constexpr int LD = D + 8, CH = D / 8;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = s_l[mt][h][tid];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[h] = l > 0.f ? 1.f / l : 0.f;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 16 * mt + (lane >> 2) + 8 * h;
        const int col = nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<u32*>(sQ + r * LD + col) =
            pack_bf16(o[mt][nt][2 * h] * inv[h], o[mt][nt][2 * h + 1] * inv[h]);
      }
    }
  }
  __syncwarp();
  {
    // lane: chunk c of rows r1, r1 + OS, ... of this warp's 16 * MT rows, (token, head) stepped as above
    constexpr int OS = 32 / CH;
    static_assert(32 % CH == 0 && (16 * MT) % OS == 0, "whole rows per warp sweep");
    const int c = lane % CH, r1 = row0 + lane / CH;
    RowStep rg(r1, OS, G);
    // element offset of (token t0 + tt, head kvh * G + g, chunk c) in out, stepped with (tt, g)
    long long off = ((long long)(t0 + rg.tt) * n_q + kvh * G + rg.g) * D + c * 8;
    const long long step = ((long long)rg.dq * n_q + rg.dr) * D, wrap = (long long)(n_q - G) * D;
#pragma unroll 4
    for (int r = r1; r < row0 + 16 * MT; r += OS) {
      if (r < rows_used && t0 + rg.tt < T)
        *reinterpret_cast<uint4*>(out + off) = *reinterpret_cast<const uint4*>(sQ + r * LD + c * 8);
      off += step;
      if (rg.next()) off += wrap;
    }
  }
}

// The next sequence (index > last) present in the CTA's token table, and the keys its pass needs: [0, L).
// b = 0x7fffffff when none is left. Every thread scans the same shared memory: uniform.
__device__ __forceinline__ void next_prefill_pass(const int* s_seq, const int* s_pos, int TT, int last,
                                                  const int* __restrict__ seq_lens, int& b, int& L, int& slen) {
  b = 0x7fffffff;
  for (int tt = 0; tt < TT; ++tt) {
    const int sq = s_seq[tt];
    if (sq > last && sq < b) b = sq;
  }
  if (b == 0x7fffffff) return;
  int maxpos = -1;
  for (int tt = 0; tt < TT; ++tt)
    if (s_seq[tt] == b) maxpos = max(maxpos, s_pos[tt]);
  slen = seq_lens[b];
  L = min(maxpos + 1, slen);
}

template <int D, int BN_, int BM_, int MT_, bool WG_ = false>
struct PrefillCfg {
  // MT = 1: one warp per 16 query rows (BM = 64: 4 warps), Q fragments held in registers; the Q tile
  //   [BM][LD] lives in stage 1 until they are loaded. (BM = 128 with 8 such warps measured slower
  //   than both kernels kept: docs/performance/prefill.md.) Dynamic shared memory:
  //   2 stages x (K [BN][LD], V [BN][LD]) bf16 = 4 * BN * LD * 2 bytes (BN = 64: D=128 69632, D=64
  //   36864, D=32 20480).
  // MT = 2: one warp per 32 query rows, two 16-row tiles sharing every K/V fragment it loads from
  //   shared memory (half the ldmatrix traffic per MMA, and two independent softmax chains per warp);
  //   the Q tile keeps its own [BM][LD] buffer and is read one k-step at a time: (4 * BN + BM) * LD * 2
  //   bytes (D=128, BN=64, BM=128: 104448, two CTAs per multiprocessor).
  // ops.py computes the same numbers. The output is staged in the Q tile at the end. A row's
  // arithmetic (its key tiles, in the same order, the same k-step order in every MMA chain) depends
  // on neither BM nor MT, so all variants with the same BN agree bit for bit.
  // WG (the _wg kernel, sm_90a): BM = 128 rows as two warpgroups of 64, S = Q K^T and O += P V by
  //   wgmma with the Q and P fragments in registers and K/V tiles in the 128-byte-swizzled layout
  //   (kv_sw_index, no padding: a ring of 2 K tiles and one of V_SLOTS V tiles, BN x D x 2 bytes each)
  //   beside Q's own [BM][LD] buffer, plus 1024 bytes to align the tiles: ((2 + V_SLOTS) * BN * D +
  //   BM * LD) * 2 + 1024 bytes (D=128, BN=64: BM=128 134144, one CTA of 8 warps per multiprocessor;
  //   BM=64 (one warpgroup) 100352, two CTAs of 4 warps).
  static constexpr int BM = BM_, BN = BN_, MT = MT_, WARPS = BM_ / (16 * MT_), THREADS = 32 * WARPS, LD = D + 8;
  static constexpr bool WG = WG_;
  static constexpr bool Q_OWN = MT_ > 1 || WG_;  // Q in its own buffer (else aliased onto stage 1)
  static constexpr bool Q_REGS = MT_ == 1;       // Q fragments in registers for the whole kernel
  static constexpr int KLD = WG_ ? D : LD;       // elements per key row of a K/V tile
  // WG with two warpgroups (BM = 128): S of tile j + 1 and P V of tile j - 1 both run during tile j's
  // softmax (the key loop of paged_prefill_impl): a ring of 4 V tiles and of 4 row-offset tables
  static constexpr bool WG_AHEAD = WG_ && BM_ == 128;
  static constexpr int V_SLOTS = WG_AHEAD ? 4 : 3, OFF_TABLES = WG_AHEAD ? 4 : 2;
  static_assert(!WG_ || (D == 128 && BN_ == 64 && (BM_ == 64 || BM_ == 128) && MT_ == 1), "the wgmma kernels' shapes");
  static_assert(BM % (16 * MT) == 0 && THREADS >= BM, "whole row tiles per warp; one thread per row for the row table");
  static_assert(Q_OWN || BM <= 2 * BN, "the Q tile is aliased onto one K/V stage");
};

template <int D, int BN_, int BM_, int MT_, bool WG_ = false>
__device__ __forceinline__ void paged_prefill_impl(const __nv_bfloat16* __restrict__ q, int q_stride,
                                                   const __nv_bfloat16* __restrict__ k_cache,
                                                   const __nv_bfloat16* __restrict__ v_cache,
                                                   const int* __restrict__ block_tables, int max_blocks,
                                                   const int* __restrict__ seq_lens, const int* __restrict__ q_seq_idx,
                                                   const int* __restrict__ q_pos, __nv_bfloat16* __restrict__ out, int T,
                                                   int B, int n_q, int n_kv, int block_size, float scale,
                                                   const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                                   int max_pos) {
  typedef PrefillCfg<D, BN_, BM_, MT_, WG_> C;
  constexpr int BM = C::BM, BN = C::BN, MT = C::MT, THREADS = C::THREADS;
  constexpr int STAGE = 2 * BN * C::KLD;  // one stage: K [BN][KLD] then V [BN][KLD]
  constexpr int TILE = BN * C::KLD;       // WG: a K ring of 2 tiles, then a V ring of 3
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // (WG: the tiles on a 1024-byte boundary, the period of their swizzle; the host adds the slack)
  unsigned char* smem_base = C::WG ? smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u) : smem_raw;
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem_base);  // stage st: K at sK + st*STAGE
  __nv_bfloat16* sV = C::WG ? sK + 2 * TILE : sK + TILE;              //           V at sV + st*STAGE
  __nv_bfloat16* sQ = C::WG ? sK + (2 + C::V_SLOTS) * TILE : sK + (C::Q_OWN ? 2 : 1) * STAGE;  // [BM][LD]: own, or stage 1
  const u32 sK_u = smem_u32(sK), sV_u = smem_u32(sV), sQ_u = smem_u32(sQ);  // the same, as shared addresses
  __shared__ int s_seq[BM];
  __shared__ int s_pos[BM];
  __shared__ int s_lim[BM];             // per pass: the last key each row sees
  __shared__ int s_off[C::OFF_TABLES][BN];  // row-offset tables of two (WG_AHEAD: four) K/V tiles (load_kv_tile)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int row0 = warp * 16 * MT;  // this warp's first query row of the tile
  const int G = n_q / n_kv;
  const int TT = BM / G;  // tokens per CTA (host guarantees 1 <= G <= BM)
  const int rows_used = TT * G;
  // The CTAs' order (the launch's block order: blockIdx.x fastest). The mma.sync kernels get the grid
  // (n_kv, tiles) and take every KV head of the last (heaviest) tile first, then of the tile before:
  // the longest CTAs of a causal prefill all start in the first wave. The wgmma kernels get (tiles,
  // n_kv) and keep a KV head's tiles together, heaviest first, then the next head's: CTAs running
  // together share that head's keys in L2. Measured on the H200 in one process (docs/performance/prefill.md,
  // "The CTAs' order"); ops.paged_prefill builds the grid to match (PREFILL_WGMMA).
  constexpr bool heavy_first = !C::WG;
  const int tile = heavy_first ? gridDim.y - 1 - blockIdx.y : gridDim.x - 1 - blockIdx.x;
  const int kvh = heavy_first ? blockIdx.x : blockIdx.y;
  const int t0 = tile * TT;
  const int bs_log2 = block_shift(block_size);

  if (tid < BM) token_row(s_seq, s_pos, q_seq_idx, q_pos, t0, tid, TT, T, B);
  __syncthreads();  // the row table (s_seq, s_pos)
  // Q tile -> shared by cp.async (rows of padding, of a token past T or of no valid sequence
  // zero-filled: such rows are in no pass and write zeros), a commit group of its own. With its own
  // buffer (MT = 2) nothing waits for it here: it lands with the first K/V tile, whose copies the first
  // pass issues right away, so the two loads' latencies overlap.
  load_q_tile<D, BM, THREADS>(sQ, q, q_stride, s_pos, t0, kvh, G, tid);
  cp_async_commit();

  u32 qf[C::Q_REGS ? D / 16 : 1][4];  // MT = 1: the Q fragments, in registers for the whole kernel
  bool q_in_regs = false;             // WG: loaded at the first key tile, once its wait has seen Q land
  (void)q_in_regs;
  if constexpr (C::Q_REGS && !C::Q_OWN) {
    cp_async_wait<0>();
    __syncthreads();
    load_q_frags<D>(qf, smem_u32(sQ), row0, lane);
    __syncthreads();  // every warp holds its Q fragments before stage 1 is overwritten
  }

  float o[MT][D / 8][4];
  // the running maxima and sums (touched once per tile) in shared memory, each thread its own slots,
  // which keeps the registers of the two-tile kernel under the 255 cap
  __shared__ float s_m[MT][2][THREADS];
  __shared__ float s_l[MT][2][THREADS];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.f;
    s_m[mt][0][tid] = s_m[mt][1][tid] = neg_inf();
    s_l[mt][0][tid] = s_l[mt][1][tid] = 0.f;
  }
  const float sl2 = scale * kLog2e;

  int last = -1;
  while (true) {
    // Next sequence present in this tile (uniform across the CTA: every thread scans the same smem)
    // and the keys its pass needs: [0, L)
    int b, L = 0, slen = 0;
    next_prefill_pass(s_seq, s_pos, TT, last, seq_lens, b, L, slen);
    if (b == 0x7fffffff) break;
    // the last visible key of every row of the tile in this pass (-1: none), once per pass; each
    // thread reads its four rows' limits at every tile (one shared load each: the row -> token
    // division and the row-table lookups stay out of the key loop, and out of the registers)
    if (tid < BM) {
      int lm = -1;
      if (tid < rows_used) {
        const int tt = tid / G;
        if (s_seq[tt] == b) lm = min(s_pos[tt], slen - 1);
      }
      s_lim[tid] = lm;
    }
    const int* bt = block_tables + (long long)b * max_blocks;
    const int ntiles = L > 0 ? (L + BN - 1) / BN : 0;
    if constexpr (C::WG_AHEAD) {  // tiles 0, 1 and 2
      if (tid < 3 * BN) s_off[tid / BN][tid % BN] = row_offset(bt, tid, L, n_kv, D, block_size, bs_log2);
    } else {
      tile_row_offsets<BN, THREADS>(s_off, bt, 0, L, n_kv, D, block_size, bs_log2, tid);  // tiles 0 and 1
    }
    __syncthreads();
    if constexpr (C::WG_AHEAD) {
#ifdef TK_WGMMA
      // The two-warpgroup wgmma kernel's key loop: tile j's S was computed in the iteration before; S of
      // tile j + 1 and P V of tile j - 1 are issued together and run on the tensor cores during tile j's
      // softmax; O waits for them only at its rescale. Copies run two tiles ahead: tile t's K in ring
      // slot t % 2, its V in slot t % 4, its row-offset table in s_off[t % 4] (written, one row per
      // thread, three tiles ahead). A slot is overwritten only after the MMAs that read it were waited
      // for and a barrier passed.
      if (ntiles > 0) {
        load_kv_tile_sw<D, BN, THREADS>(sK_u, sV_u, k_cache, v_cache, s_off[0], kvh, tid);
        cp_async_commit();
        if (ntiles > 1) load_kv_tile_sw<D, BN, THREADS>(sK_u + TILE * 2, sV_u + TILE * 2, k_cache, v_cache, s_off[1], kvh, tid);
        cp_async_commit();
        cp_async_wait<1>();  // tile 0 (and Q, committed before it)
        fence_proxy_async_smem();
        __syncthreads();
        if (cos_t != nullptr) {  // fused RoPE (uniform branch)
          rotate_k_tile<D, BN, THREADS, true>(sK, 0, L, cos_t, sin_t, max_pos, tid);
          fence_proxy_async_smem();
          __syncthreads();
        }
        if (!q_in_regs) {
          load_q_frags<D>(qf, sQ_u, row0, lane);
          q_in_regs = true;
        }
        float s[1][BN / 8][4], sn[BN / 8][4];  // S of tile j (softmax now), of tile j + 1 (in flight)
        tile_scores_wg<D, BN>(qf, sK_u, s[0]);
        wg_wait<0>();
        wg_fence_regs(s[0]);
        u32 pa[BN / 16][4];  // P of tile j - 1, as A fragments: its P V is in flight during tile j's softmax
        for (int j = 0; j < ntiles; ++j) {
          const int ahead = (j + 3) * BN + tid;  // row tid of tile j + 3 (its table entry: end of the iteration)
          const int ahead_page = (tid < BN && j + 3 < ntiles) ? row_page(bt, ahead, L, block_size, bs_log2) : -1;
          if (j + 1 < ntiles) {
            cp_async_wait<0>();  // tile j + 1
            fence_proxy_async_smem();
            __syncthreads();
            if (cos_t != nullptr) {
              rotate_k_tile<D, BN, THREADS, true>(sK + ((j + 1) & 1) * TILE, (j + 1) * BN, L, cos_t, sin_t, max_pos, tid);
              fence_proxy_async_smem();
              __syncthreads();
            }
            if (j + 2 < ntiles)  // K slot j % 2 (S of tile j: waited), V slot (j + 2) % 4 (P V of tile j - 2: waited)
              load_kv_tile_sw<D, BN, THREADS>(sK_u + (j & 1) * TILE * 2, sV_u + ((j + 2) & 3) * TILE * 2, k_cache,
                                              v_cache, s_off[(j + 2) & 3], kvh, tid);
            cp_async_commit();
            tile_scores_wg<D, BN>(qf, sK_u + ((j + 1) & 1) * TILE * 2, sn);
          }
          if (j > 0) tile_pv_wg<D, BN>(pa, sV_u + ((j - 1) & 3) * TILE * 2, o[0]);
          float alphas[1][2];
          softmax_tile_deferred<D, BN, THREADS>(s, j * BN, s_lim, s_m, s_l, row0, lane, tid, sl2, o, alphas);
          wg_wait<0>();  // S of tile j + 1 and P V of tile j - 1 have landed
          wg_fence_regs(o[0]);
          wg_fence_regs(sn);
          rescale_o<D, 1>(alphas, o);
          pack_p<BN>(s[0], pa);
#pragma unroll
          for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[0][nt][i] = sn[nt][i];
          if (tid < BN && j + 3 < ntiles)  // row tid of tile j + 3 -> s_off[(j + 3) % 4] (tile j - 1's, spent)
            s_off[(j + 3) & 3][tid] =
                slot_chunk(ahead_page, ahead, block_of(ahead, block_size, bs_log2), L, n_kv, D, block_size);
        }
        tile_pv_wg<D, BN>(pa, sV_u + ((ntiles - 1) & 3) * TILE * 2, o[0]);  // the last tile's P V
        wg_wait<0>();
        wg_fence_regs(o[0]);
        __syncthreads();  // every warpgroup is done with the slots before the next pass's copies
      }
#endif
    } else if constexpr (C::WG) {
#ifdef TK_WGMMA
      // The wgmma kernels' key loop. Tile j's K sits in ring slot j % 2, its V in slot j % 3: P V of
      // tile j - 1 is issued behind S of tile j and runs on the tensor cores while this warpgroup does
      // tile j's softmax; O waits for it only at its rescale. (The slot a tile's copies overwrite was
      // last read by MMAs waited for in the iteration before, ahead of its closing barrier.)
      if (ntiles > 0) {
        load_kv_tile_sw<D, BN, THREADS>(sK_u, sV_u, k_cache, v_cache, s_off[0], kvh, tid);
        cp_async_commit();
        u32 pa[BN / 16][4];  // P of the tile before, as A fragments: its P V may be in flight
        for (int j = 0; j < ntiles; ++j) {
          const int ks = j & 1;
          const int ahead = (j + 2) * BN + tid;  // row tid of tile j + 2 (its table entry: end of the iteration)
          const int ahead_page = (tid < BN && j + 2 < ntiles) ? row_page(bt, ahead, L, block_size, bs_log2) : -1;
          if (j + 1 < ntiles)
            load_kv_tile_sw<D, BN, THREADS>(sK_u + (ks ^ 1) * TILE * 2, sV_u + ((j + 1) % 3) * TILE * 2, k_cache,
                                            v_cache, s_off[ks ^ 1], kvh, tid);
          cp_async_commit();
          cp_async_wait<1>();
          fence_proxy_async_smem();  // the landed tile, to wgmma's (async) proxy
          __syncthreads();
          if (cos_t != nullptr) {  // fused RoPE (uniform branch)
            rotate_k_tile<D, BN, THREADS, true>(sK + ks * TILE, j * BN, L, cos_t, sin_t, max_pos, tid);
            fence_proxy_async_smem();
            __syncthreads();
          }
          if (!q_in_regs) {  // the first tile's wait covered Q's commit group (committed before it)
            load_q_frags<D>(qf, sQ_u, row0, lane);
            q_in_regs = true;
          }
          float s[1][BN / 8][4];
          tile_scores_wg<D, BN>(qf, sK_u + ks * TILE * 2, s[0]);
          if (j > 0) {
            tile_pv_wg<D, BN>(pa, sV_u + ((j + 2) % 3) * TILE * 2, o[0]);  // tile j - 1's P V, behind S
            wg_wait<1>();                                                  // S has landed
          } else {
            wg_wait<0>();
          }
          wg_fence_regs(s[0]);
          float alphas[1][2];
          softmax_tile_deferred<D, BN, THREADS>(s, j * BN, s_lim, s_m, s_l, row0, lane, tid, sl2, o, alphas);
          wg_wait<0>();  // tile j - 1's P V has landed in O
          wg_fence_regs(o[0]);
          rescale_o<D, 1>(alphas, o);
          pack_p<BN>(s[0], pa);
          if (tid < BN && j + 2 < ntiles)  // row tid of tile j + 2 -> s_off[ks], for the next iteration's copies
            s_off[ks][tid] = slot_chunk(ahead_page, ahead, block_of(ahead, block_size, bs_log2), L, n_kv, D, block_size);
          __syncthreads();
        }
        tile_pv_wg<D, BN>(pa, sV_u + ((ntiles - 1) % 3) * TILE * 2, o[0]);  // the last tile's P V
        wg_wait<0>();
        wg_fence_regs(o[0]);
      }
#endif
    } else if (ntiles > 0) {
      load_kv_tile<D, BN, THREADS>(sK, sV, k_cache, v_cache, s_off[0], kvh, tid);
      cp_async_commit();
      for (int j = 0; j < ntiles; ++j) {
        const int st = j & 1;
        // row tid of tile j + 2: its page is read here and its table entry written at the end of the
        // iteration, so the block-table round trip overlaps the tile's work, not the closing barrier
        // (the two-tile kernel, at its register limit, reads it at the end: one live register less)
        const int ahead = (j + 2) * BN + tid;
        const int ahead_page =
            (C::MT == 1 && tid < BN && j + 2 < ntiles) ? row_page(bt, ahead, L, block_size, bs_log2) : -1;
        if (j + 1 < ntiles)
          load_kv_tile<D, BN, THREADS>(sK + (st ^ 1) * STAGE, sV + (st ^ 1) * STAGE, k_cache, v_cache,
                                       s_off[st ^ 1], kvh, tid);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (cos_t != nullptr) {  // fused RoPE (uniform branch)
          rotate_k_tile<D, BN, THREADS>(sK + st * STAGE, j * BN, L, cos_t, sin_t, max_pos, tid);
          __syncthreads();
        }
        float s[MT][BN / 8][4];
        if constexpr (C::Q_OWN) {
          tile_scores_sq<D, BN / 8, MT>(sQ_u, row0, sK_u + st * STAGE * 2, lane, s);
        } else {
          tile_scores<D, BN / 8>(qf, sK_u + st * STAGE * 2, lane, s[0]);
        }
        int lim[MT][2];
        float m2[MT][2], l2[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            lim[mt][h] = s_lim[row0 + 16 * mt + (lane >> 2) + 8 * h];
            m2[mt][h] = s_m[mt][h][tid];
            l2[mt][h] = s_l[mt][h][tid];
          }
        }
        float unused[MT][2];
        online_softmax<D, BN / 8, MT>(s, j * BN, lim, sl2, lane, m2, l2, o, unused);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            s_m[mt][h][tid] = m2[mt][h];
            s_l[mt][h][tid] = l2[mt][h];
          }
        }
        tile_pv_mt<D, BN / 8, MT>(s, sV_u + st * STAGE * 2, lane, o);
        if (tid < BN && j + 2 < ntiles)  // row tid of tile j + 2 -> s_off[st], for the next iteration's copies
          s_off[st][tid] = C::MT > 1 ? row_offset(bt, ahead, L, n_kv, D, block_size, bs_log2)
                                    : slot_chunk(ahead_page, ahead, block_of(ahead, block_size, bs_log2), L, n_kv, D,
                                                 block_size);
        __syncthreads();
      }
    }
    last = b;
  }

  // Normalise and stage this warp's rows (bf16) in its own rows of sQ, then 16-byte stores. (Safe:
  // with MT = 1 every pass ends with a CTA barrier after the last read of the stage buffers; with
  // MT = 2 only this warp ever reads its rows of the Q tile, and the Q copies have landed: by the first
  // tile's wait, or, in a CTA without a key tile, by the wait here.)
  if constexpr (C::Q_OWN) {
    cp_async_wait<0>();
    __syncthreads();
  }
  store_out_rows<D, MT, THREADS>(o, s_l, sQ, out, tid, row0, lane, rows_used, t0, T, n_q, kvh, G);
}

#ifdef TK_WGMMA
// ------------------------------------------------------------------------------------------------
// paged_prefill_d128_ws: the wgmma prefill with warp specialisation (flash-attention-3's structure)
//
// The same math, tiles and bits as paged_prefill_d128_wg128 (128 query rows a CTA, 64-key tiles in the
// 128-byte-swizzled layout, every row's products chained in the same order), with the copies and the
// MMAs in different warps. Three warpgroups, one CTA a multiprocessor:
//   warpgroup 0, the producer (setmaxnreg down to WS_PRODUCER_REGS): looks the pages up, issues each
//     tile's K and V copies (cp.async) into a ring of WS_STAGES slots, and marks a slot full on its
//     mbarrier once its copies have landed (each producer thread: wait for its copies, proxy fence,
//     arrive; with fused RoPE it rotates the K tile first). It waits on a slot's "empty" barrier
//     before refilling it.
//   warpgroups 1 and 2, the consumers (setmaxnreg up to WS_CONSUMER_REGS): 64 query rows each, the
//     wg64 kernel's loop (S of tile j issued, then P V of tile j - 1 behind it, tile j's softmax while
//     P V runs) with an mbarrier wait where that kernel had a CTA barrier; when P V of tile j - 1 has
//     landed each consumer warp arrives on its slot's "empty" barrier.
// No CTA barrier sits in the key loop, so the two consumer warpgroups drift apart and one's softmax
// overlaps the other's MMAs, and the copies never wait for the slowest warp.
// Work items are (tile of TT query tokens, KV head), numbered heaviest first (every KV head of the last tile,
// then of the tile before, as the mma.sync kernels' grid); CTA c takes items c, c + gridDim.x, ... (the host
// launches min(items, ops.WS_CTAS_PER_SM x SMs) CTAs, or one per item), so a CTA's producer copies the next
// item's first tiles while its consumers finish the one before. Each role reads its own copy of an item's token
// table. Both roles walk the same items and passes (one per sequence of the tile) and number the tiles of all
// of them consecutively: tile n lives in slot n % WS_STAGES, phase (n / WS_STAGES) & 1.
// Without fused RoPE a producer thread marks tile n full after issuing tile n + 1 (wait_group 1), so
// its copies stay in flight while it waits; a slot is refilled only after both consumers finished
// P V of the tile WS_STAGES before, which needs WS_STAGES >= 3 to never wait on a mark not yet made.
// Dynamic shared memory: WS_STAGES slots of a K and a V tile (BN x D bf16, swizzled) + Q [BM][D + 8] + 1024
// bytes of alignment slack = 166912 bytes at 4 slots (ops.prefill_smem_bytes(..., ring=4)); one CTA a
// multiprocessor, 384 threads at 168 registers at entry: 56 (producer) + 2 x 224 (consumers) = 3 x 168.
// ------------------------------------------------------------------------------------------------
constexpr int WS_STAGES = 4, WS_PRODUCER_REGS = 56, WS_CONSUMER_REGS = 224;
static_assert(WS_STAGES >= 3, "a slot's refill must not wait on a full mark the producer has not made");

__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int D, int BN>
__device__ __forceinline__ void paged_prefill_ws_impl(const __nv_bfloat16* __restrict__ q, int q_stride,
                                                      const __nv_bfloat16* __restrict__ k_cache,
                                                      const __nv_bfloat16* __restrict__ v_cache,
                                                      const int* __restrict__ block_tables, int max_blocks,
                                                      const int* __restrict__ seq_lens,
                                                      const int* __restrict__ q_seq_idx, const int* __restrict__ q_pos,
                                                      __nv_bfloat16* __restrict__ out, int T, int B, int n_q, int n_kv,
                                                      int block_size, float scale, const float* __restrict__ cos_t,
                                                      const float* __restrict__ sin_t, int max_pos) {
  static_assert(D == 128 && BN == 64, "the wgmma tiles' shapes");
  constexpr int BM = 128, NS = WS_STAGES, TILE = BN * D, CONSUMERS = 2 * BM;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // the tiles on a 1024-byte boundary (their swizzle's period; the host adds the slack):
  // K slots [NS][BN][D], V slots [NS][BN][D], Q [BM][D + 8]
  unsigned char* smem_base = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem_base);
  __nv_bfloat16* sQ = sK + 2 * NS * TILE;
  const u32 sK_u = smem_u32(sK), sV_u = sK_u + NS * TILE * 2, sQ_u = smem_u32(sQ);
  __shared__ int s_seq[2][BM];  // the work item's token table: [0] the producer's copy, [1] the consumers'
  __shared__ int s_pos[2][BM];
  __shared__ int s_lim[BM];
  __shared__ int s_off[NS][BN];                         // the producer's row-offset table of each slot
  __shared__ __align__(8) unsigned long long s_bar[2 * NS];  // full[NS], then empty[NS]
  __shared__ float s_m[1][2][CONSUMERS];
  __shared__ float s_l[1][2][CONSUMERS];

  const int tid = threadIdx.x;
  const int G = n_q / n_kv;
  const int TT = BM / G;
  const int rows_used = TT * G;
  const int items = ((T + TT - 1) / TT) * n_kv;  // work items: (tile of TT tokens, KV head)
  const int bs_log2 = block_shift(block_size);
  const u32 full0 = smem_u32(&s_bar[0]), empty0 = smem_u32(&s_bar[NS]);  // slot s: + 8 s

  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < NS; ++st) {
      mbar_init(full0 + 8 * st, 128);  // every producer thread
      mbar_init(empty0 + 8 * st, 8);   // lane 0 of every consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // the barriers; the last CTA-wide barrier

  // the warpgroup's index from lane 0 of the warp: ptxas then knows the role branch is warp-uniform (a
  // branch on tid alone made it serialise the consumers' wgmma, its advice C7518)
  const int role = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int rtid = role == 0 ? tid : tid - 128;  // index within the role: producer 0..127, consumers 0..255
  const int* tseq = s_seq[role == 0 ? 0 : 1];
  const int* tpos = s_pos[role == 0 ? 0 : 1];
  // The role's copy of work item w's token table (rows of a token past T or of no valid sequence: -1), between
  // two barriers of the role (bar_id, threads): the first waits until the role is done with the item before.
  auto token_table = [&](int w, int bar_id, int threads) {
    named_bar_sync(bar_id, threads);
    const int t0 = ((items / n_kv) - 1 - w / n_kv) * TT;
    if (rtid < BM) token_row(s_seq[role == 0 ? 0 : 1], s_pos[role == 0 ? 0 : 1], q_seq_idx, q_pos, t0, rtid, TT, T, B);
    named_bar_sync(bar_id, threads);
  };

  if (role == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
    int n = 0;
    for (int w = blockIdx.x; w < items; w += gridDim.x) {
      const int kvh = w % n_kv;
      token_table(w, 1, 128);
      int last = -1;
      while (true) {
        int b, L = 0, slen = 0;
        next_prefill_pass(tseq, tpos, TT, last, seq_lens, b, L, slen);
        if (b == 0x7fffffff) break;
        const int* bt = block_tables + (long long)b * max_blocks;
        const int ntiles = L > 0 ? (L + BN - 1) / BN : 0;
        for (int j = 0; j < ntiles; ++j, ++n) {
          const int st = n % NS;
          const int off = tid < BN ? row_offset(bt, j * BN + tid, L, n_kv, D, block_size, bs_log2) : 0;
          mbar_wait_uniform(empty0 + 8 * st, ((n / NS) & 1) ^ 1);  // both consumers are done with tile n - NS
          if (tid < BN) s_off[st][tid] = off;
          named_bar_sync(1, 128);  // the table (and every producer thread past the wait)
          load_kv_tile_sw<D, BN, 128>(sK_u + st * TILE * 2, sV_u + st * TILE * 2, k_cache, v_cache, s_off[st], kvh,
                                      tid);
          cp_async_commit();
          if (cos_t != nullptr) {  // fused RoPE (uniform branch): rotate the landed K tile, then mark it
            cp_async_wait<0>();
            named_bar_sync(1, 128);
            rotate_k_tile<D, BN, 128, true>(sK + st * TILE, j * BN, L, cos_t, sin_t, max_pos, tid);
            fence_proxy_async_smem();
            mbar_arrive(full0 + 8 * st);
          } else if (j > 0) {  // tile n - 1 has landed (this thread's copies): mark it
            cp_async_wait<1>();
            fence_proxy_async_smem();
            mbar_arrive(full0 + 8 * ((n - 1) % NS));
          }
        }
        if (cos_t == nullptr && ntiles > 0) {  // the pass's last tile
          cp_async_wait<0>();
          fence_proxy_async_smem();
          mbar_arrive(full0 + 8 * ((n - 1) % NS));
        }
        last = b;
      }
    }
    return;
  }

  // ---- consumers: warpgroups 1 and 2, 64 query rows each ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_CONSUMER_REGS));
  const int ctid = rtid, lane = tid & 31, wg = role - 1;
  const int row0 = (ctid >> 5) * 16;  // this warp's first query row
  const float sl2 = scale * kLog2e;
  // The consumers take turns to issue their MMAs (flash-attention 3's ping-pong): warpgroup w issues S and P V
  // after a barrier (5 + w) that the other one arrives on once it has issued its own, so one's softmax runs
  // under the other's MMAs; the second lets the first go first. (-DTK_WS_NO_PINGPONG, a lab switch: free
  // drift. The turns were 0.4-4.6% faster on the H200, docs/performance/prefill.md.)
#ifndef TK_WS_NO_PINGPONG
#define TK_WS_TURN_DONE named_bar_arrive(5 + (wg ^ 1), 2 * 128)
  if (wg == 1) named_bar_arrive(5, 2 * 128);
#else
#define TK_WS_TURN_DONE
#endif
  int n = 0;
  for (int w = blockIdx.x; w < items; w += gridDim.x) {
    const int kvh = w % n_kv, t0 = ((items / n_kv) - 1 - w / n_kv) * TT;  // every KV head of the heaviest tile first
    token_table(w, 2, CONSUMERS);  // (its first barrier: every consumer warp has stored the item before)
    load_q_tile<D, BM, CONSUMERS>(sQ, q, q_stride, tpos, t0, kvh, G, ctid);
    cp_async_commit();
    float o[1][D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[0][nt][0] = o[0][nt][1] = o[0][nt][2] = o[0][nt][3] = 0.f;
    s_m[0][0][ctid] = s_m[0][1][ctid] = neg_inf();
    s_l[0][0][ctid] = s_l[0][1][ctid] = 0.f;
    cp_async_wait<0>();
    named_bar_sync(2, CONSUMERS);  // the Q tile has landed
    u32 qf[D / 16][4];
    load_q_frags<D>(qf, sQ_u, row0, lane);

    u32 pa[BN / 16][4];  // P of the tile before, as A fragments: its P V may be in flight
    int last = -1;
    while (true) {
      int b, L = 0, slen = 0;
      next_prefill_pass(tseq, tpos, TT, last, seq_lens, b, L, slen);
      if (b == 0x7fffffff) break;
      // this warpgroup's 64 rows' last visible keys (after the previous pass's last read of them)
      named_bar_sync(3 + wg, 128);
      if ((ctid & 127) < 64) {
        const int r = wg * 64 + (ctid & 127);
        int lm = -1;
        if (r < rows_used) {
          const int tt = r / G;
          if (tseq[tt] == b) lm = min(tpos[tt], slen - 1);
        }
        s_lim[r] = lm;
      }
      named_bar_sync(3 + wg, 128);
      const int ntiles = L > 0 ? (L + BN - 1) / BN : 0;
      for (int j = 0; j < ntiles; ++j, ++n) {
        const int st = n % NS, prev = (n + NS - 1) % NS;
        mbar_wait_uniform(full0 + 8 * st, (n / NS) & 1);  // tile n has landed (and, with fused RoPE, is rotated)
        float s[1][BN / 8][4];
#ifndef TK_WS_NO_PINGPONG
        named_bar_sync(5 + wg, 2 * 128);  // this warpgroup's turn
#endif
        tile_scores_wg<D, BN>(qf, sK_u + st * TILE * 2, s[0]);
        if (j > 0) {
          tile_pv_wg<D, BN>(pa, sV_u + prev * TILE * 2, o[0]);  // tile n - 1's P V, behind S
          TK_WS_TURN_DONE;
          wg_wait<1>();  // S has landed
        } else {
          TK_WS_TURN_DONE;
          wg_wait<0>();
        }
        wg_fence_regs(s[0]);
        float alphas[1][2];
        softmax_tile_deferred<D, BN, CONSUMERS>(s, j * BN, s_lim, s_m, s_l, row0, lane, ctid, sl2, o, alphas);
        wg_wait<0>();  // tile n - 1's P V has landed in O: its slot is free
        wg_fence_regs(o[0]);
        mbar_arrive_if(empty0 + 8 * prev, j > 0 && lane == 0);
        rescale_o<D, 1>(alphas, o);
        pack_p<BN>(s[0], pa);
      }
      if (ntiles > 0) {  // the pass's last tile's P V
        const int prev = (n + NS - 1) % NS;
        tile_pv_wg<D, BN>(pa, sV_u + prev * TILE * 2, o[0]);
        wg_wait<0>();
        wg_fence_regs(o[0]);
        mbar_arrive_if(empty0 + 8 * prev, lane == 0);
      }
      last = b;
    }
    store_out_rows<D, 1, CONSUMERS>(o, s_l, sQ, out, ctid, row0, lane, rows_used, t0, T, n_q, kvh, G);
  }
#ifndef TK_WS_NO_PINGPONG
  if (wg == 0) named_bar_sync(5, 2 * 128);  // the second warpgroup's last arrival: every barrier ends balanced
#endif
#undef TK_WS_TURN_DONE
}
#endif  // TK_WGMMA

// ------------------------------------------------------------------------------------------------
// split_kv_partials
//
// Math (twin: reference split_kv_partials): one query per row b (a sequence's last token, so every
// cached key is visible). Row b reads block-table row row_seq[b] (b itself when row_seq is null):
// batch-invariant mode runs every prefill token through this kernel as its own row, with
// seq_lens[b] = its position + 1 (twin: invariant_attention). Split k of row b covers key positions
// [k*S, min((k+1)*S, seq_len[b])) and writes, per query head h,
//   o_part[b, k, h] = sum_j softmax_j(scale * q[b, h] . k_j) v_j   (fp32)
//   lse[b, k, h]    = log(sum_j exp(scale * q . k_j))              (natural log)
// An empty split writes o = 0, lse = -inf.
//
// Fused reduce (out != null; split_kv_decode): the kernel also does split_kv_reduce's work and writes
// bf16 out [B, n_q, D] itself. Only the n_live = min(max_splits, ceil(seq_len / S)) splits that hold
// keys do anything: with one of them the CTA writes its normalised state straight to out (no partials);
// with more, each writes its partials, takes a ticket (tickets[b * gridDim.y + blockIdx.y], an atomic
// counter that starts and ends at zero) with release semantics, and the CTA that draws the last ticket
// folds splits 0 .. n_live-1 in index order exactly as split_kv_reduce does -- so the bits do not
// depend on which CTA finishes last, and equal those of the two-kernel path. seq_len 0: split 0
// writes zeros. One launch instead of two, and no partials at all for short sequences.
//
// CTA = (split, KV head x group of <= 8 query heads, sequence); K/V is read once for all the heads
// of a group (16-byte cp.async loads, double-buffered 64-key tiles). Each of the 4 warps takes 16 keys
// of a tile with its own online-softmax state; the 4 states are merged at the end in fixed warp order
// (deterministic).
//
// Keys are the 16-row side of every MMA ("keys as rows"): a decode CTA has one query per head, and the
// GQA groups of Qwen3 are 2-8 heads, so with the queries on the 16-row side (as in paged_prefill) 8 to
// 14 of the 16 rows were padding. With the operands swapped a warp computes, per 16 keys,
//   S^T (16 keys x 8 queries)  = K (16 x D) . Q^T (D x 8)       D/16 MMAs (Q^T: B fragments, in registers)
//   O^T (D x 8 queries)       += V^T (D x 16 keys) . P^T (16 x 8) D/16 MMAs (V^T: transposed ldmatrix)
// half the MMAs of the 16-query-row layout, a quarter of the softmax elements per thread and half the
// accumulator registers. P^T's C fragment holds a key per row g; the B operand wants keys along t: each
// of its two 8x8 halves is transposed in registers (movmatrix). A query's maximum is reduced over the
// 8 lanes that share its column (t), and its running sum stays a per-lane partial until the merge.
// ------------------------------------------------------------------------------------------------
template <int D>
struct DecodeCfg {
  // dynamic shared memory: Q [16][LD] + 2 stages x (K, V) [BN][LD], bf16 -> (16 + 4*BN) * LD * 2 bytes
  // (D=128: 73984, D=64: 39168, D=32: 21760; ops.py computes the same number). Only Q rows 0..NQ-1 are
  // used since keys became the MMAs' rows; the buffer kept its 16 rows, the size every H200 figure of
  // this kernel was measured with (8 rows would save 2 KB a CTA: two CTAs a multiprocessor either way).
#ifndef TK_DIAG_SMEM64
  static constexpr int BN = 64, THREADS = 128, LD = D + 8, NQ = 8;
#else  // (a diagnostic build: unpadded rows and Q over K's stage 1, 64 KB at D = 128; wrong outputs, timing only)
  static constexpr int BN = 64, THREADS = 128, LD = D, NQ = 8;
#endif
  // the warps' fp32 states at the end, [4 warps][NQ queries][OLD]: lane (g, t) stores dims g, g+8 of
  // queries 2t, 2t+1; with a row stride of D + 4 floats the four t groups land 8 banks apart
  // (conflict-free 32-bit stores)
  static constexpr int OLD = D + 4;
  static_assert(4 * NQ * OLD * 4 <= 4 * BN * LD * 2, "warp-merge buffer must fit in the stage buffers");
};

// B fragments of Q^T (D dims x 8 queries) for each 16-dim k-step, from the Q tile's rows 0..7.
// ldmatrix.x4 matrix i = (queries 0..7, dims 32j + 8i .. +7): b0, b1 of k-step 2j, then of 2j + 1.
template <int D>
__device__ __forceinline__ void load_qt_frags(u32 (&qb)[D / 16][2], u32 sQ, int lane) {
  constexpr int LD = D + 8, KS = D / 16;
  const u32 base = sQ + ((lane & 7) * LD + (lane >> 3) * 8) * 2;
#pragma unroll
  for (int j = 0; j < KS / 2; ++j) ldsm_x4(qb[2 * j][0], qb[2 * j][1], qb[2 * j + 1][0], qb[2 * j + 1][1], base + j * 32 * 2);
  if constexpr (KS % 2 == 1) ldsm_x2(qb[KS - 1][0], qb[KS - 1][1], base + (KS - 1) * 16 * 2);
}

// s (16 keys x 8 queries, C layout: c0, c1 = key g, queries 2t, 2t+1; c2, c3 = key g + 8) = K . Q^T for
// the 16 keys at sK row 0. The k-steps alternate between two accumulators (two dependency chains of
// D/32 MMAs instead of one of D/16), added at the end.
template <int D>
__device__ __forceinline__ void tile_scores_t(const u32 (&qb)[D / 16][2], u32 sK, int lane, float (&s)[4]) {
  constexpr int LD = D + 8, KS = D / 16;
  const int mi = lane >> 3;
  // A = K: matrices (keys 0..7, dims +0..7), (keys 8..15, dims +0..7), (keys 0..7, dims +8..15), (keys 8..15, +8..15)
  const u32 base = sK + ((((mi & 1) << 3) + (lane & 7)) * LD + ((mi >> 1) << 3)) * 2;
  float acc[2][4];
#pragma unroll
  for (int c = 0; c < 2; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    u32 a[4];
    ldsm_x4(a[0], a[1], a[2], a[3], base + kk * 16 * 2);
    mma_bf16(acc[kk & 1], a, qb[kk][0], qb[kk][1]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = KS > 1 ? acc[0][i] + acc[1][i] : acc[0][i];
}

// How far (log2 domain) a score may rise above its query's reference maximum m_ before the split-KV decode
// moves m_ (online_softmax_t): probabilities stay <= 2^8 = 256, which bf16 (P's MMA operand) holds with the
// same relative precision as any other value and which the fp32 sums l_ and o cannot overflow on.
constexpr float kRescaleSlack = 8.f;

// One online-softmax step of the keys-as-rows layout: this lane holds keys key0 (s[0], s[1]) and
// key0 + 8 (s[2], s[3]) of queries 2t (e = 0) and 2t + 1 (e = 1); a key is visible iff key <= lim.
// m_ is each query's reference maximum (log2 domain, as in online_softmax_step): the probabilities are
// exp2(s sl2 - m_), and o and l_ (this lane's partial sum, reduced in the merge) are kept at that scale.
// While no visible score of the warp's 16 keys exceeds its query's m_ by more than kRescaleSlack -- one
// vote, and after a sequence's first tiles nearly always -- m_ stays where it is: no reduction over
// lanes, no rescale. Otherwise the maximum is reduced over the 8 lanes of the query's column (so m_
// agrees across them), m_ moves to it and o, l_ are rescaled. The merge uses whatever m_ each warp
// ended with (its weights exp2(m_w - M) put every warp's o and l at one scale), so the result is the
// softmax's whichever reference was used; only roundings differ. On return s holds exact-0-or-exp2
// probabilities. MASKED = false drops the selects (same bits).
template <int D, bool MASKED>
__device__ __forceinline__ void online_softmax_t(float (&s)[4], int key0, int lim, float sl2, float (&m_)[2],
                                                 float (&l_)[2], float (&o)[D / 16][4]) {
  if (MASKED) {
    if (key0 > lim) s[0] = s[1] = neg_inf();  // masked: selected away
    if (key0 + 8 > lim) s[2] = s[3] = neg_inf();
  }
  // m_ = -inf (nothing seen) keeps only an all-masked step here: its probabilities are the selects' zeros
  const bool keep = fmaxf(s[0], s[2]) * sl2 <= m_[0] + kRescaleSlack && fmaxf(s[1], s[3]) * sl2 <= m_[1] + kRescaleSlack;
  if (__all_sync(0xffffffffu, keep)) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int i = e; i < 4; i += 2) {
        const float v = s[i];
        s[i] = (MASKED && v == neg_inf()) ? 0.f : fast_exp2(fmaf(v, sl2, -m_[e]));  // <= 2^kRescaleSlack
      }
      l_[e] += s[e] + s[2 + e];
    }
    return;
  }
  float alpha[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float mx = fmaxf(s[e], s[2 + e]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(m_[e], mx * sl2);
    const float m_use = (m_new == neg_inf()) ? 0.f : m_new;  // never -inf - -inf
    alpha[e] = fast_exp2(m_[e] - m_use);                     // 0 while the query has seen nothing
    m_[e] = m_new;
#pragma unroll
    for (int i = e; i < 4; i += 2) {
      const float v = s[i];
      s[i] = (MASKED && v == neg_inf()) ? 0.f : fast_exp2(fmaf(v, sl2, -m_use));  // masked -> exactly 0
    }
    l_[e] = l_[e] * alpha[e] + (s[e] + s[2 + e]);
  }
  // rescale unless no query's maximum moved (alpha == 1: the identity, skipping it changes no bit)
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      o[mt][0] *= alpha[0];
      o[mt][1] *= alpha[1];
      o[mt][2] *= alpha[0];
      o[mt][3] *= alpha[1];
    }
  }
}

// o (O^T: D/16 tiles of 16 dims x 8 queries; c0, c1 = dim 16mt + g, queries 2t, 2t+1; c2, c3 = dim + 8)
// += V^T . P^T for the 16 keys at sV row 0, p the probabilities of tile_scores_t's layout.
template <int D>
__device__ __forceinline__ void tile_pv_t(const float (&p)[4], u32 sV, int lane, float (&o)[D / 16][4]) {
  constexpr int LD = D + 8;
  const int mi = lane >> 3;
  // B = P^T (16 keys x 8 queries): the C fragment's two 8 x 8 halves (keys 0..7, keys 8..15; a key per
  // row g), packed to bf16 and transposed, give b0 (keys 2t, 2t+1; query g) and b1 (keys 2t+8, 2t+9)
  const u32 b0 = movm_t(pack_bf16(p[0], p[1]));
  const u32 b1 = movm_t(pack_bf16(p[2], p[3]));
  // A = V^T (16 dims x 16 keys) by transposed loads: matrices (keys 0..7, dims +0..7), (keys 0..7,
  // dims +8..15), (keys 8..15, dims +0..7), (keys 8..15, dims +8..15)
  const u32 base = sV + ((((mi >> 1) << 3) + (lane & 7)) * LD + ((mi & 1) << 3)) * 2;
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    u32 a[4];
    ldsm_x4_t(a[0], a[1], a[2], a[3], base + mt * 16 * 2);
    mma_bf16(o[mt], a, b0, b1);
  }
}

// atomicAdd with acquire-release semantics at GPU scope (atomicAdd itself is relaxed); returns the old value
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// merge_two of reference/attention.py, split in two: the weights (once per (o, lse) row) and the
// per-element fold, in the reference's operation order (no FMA contraction).
struct MergeW {
  float wa, wb, ts;
  bool nz;
};
// Updates la to the merged lse and returns the weights for merge_o.
__device__ __forceinline__ MergeW merge_weights(float& la, float lb) {
  MergeW w;
  const float m = fmaxf(la, lb);
  const float ms = finite_f(m) ? m : 0.f;  // all -inf max -> 0: never -inf - -inf
  w.wa = expf(la - ms);                    // exp(-inf) = 0 for an empty state
  w.wb = expf(lb - ms);
  const float tot = __fadd_rn(w.wa, w.wb);
  w.nz = tot > 0.f;
  w.ts = w.nz ? tot : 1.f;
  la = w.nz ? __fadd_rn(ms, logf(w.ts)) : neg_inf();
  return w;
}
__device__ __forceinline__ float merge_o(float oa, float ob, const MergeW& w) {
  const float x = __fadd_rn(__fmul_rn(w.wa > 0.f ? oa : 0.f, w.wa), __fmul_rn(w.wb > 0.f ? ob : 0.f, w.wb));
  return w.nz ? __fdiv_rn(x, w.ts) : 0.f;
}

// reduce_splits of reference/attention.py, in its operation order (no FMA contraction): against the
// maximum m of the splits' lse (an all -inf maximum taken as 0), each split's weight w = exp(lse - m),
// the sums s = sum w and a = sum (w > 0 ? o w : 0) in index order, then o = a / s, lse = m + log(s)
// (s = 0: o = 0, lse = -inf). Four adjacent dims of one row. The weights are independent of one another
// and there is one division per element: a pairwise fold (merge_two) chained an exp, a log and a
// division per split, 0.4 us a split in the fused reduce (docs/performance/decode_attention.md).
struct SplitFold {
  float ms, s;
  float4 a;
  __device__ __forceinline__ explicit SplitFold(float m) : ms(finite_f(m) ? m : 0.f), s(0.f) {
    a = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __device__ __forceinline__ void add(float lse, const float4& o) {
    const float w = expf(lse - ms);  // exp(-inf) = 0 for an empty split
    s = __fadd_rn(s, w);
    a.x = __fadd_rn(a.x, w > 0.f ? __fmul_rn(o.x, w) : 0.f);  // an empty split adds nothing, not 0 * o
    a.y = __fadd_rn(a.y, w > 0.f ? __fmul_rn(o.y, w) : 0.f);
    a.z = __fadd_rn(a.z, w > 0.f ? __fmul_rn(o.z, w) : 0.f);
    a.w = __fadd_rn(a.w, w > 0.f ? __fmul_rn(o.w, w) : 0.f);
  }
  __device__ __forceinline__ float4 o() const {
    if (!(s > 0.f)) return make_float4(0.f, 0.f, 0.f, 0.f);
    return make_float4(__fdiv_rn(a.x, s), __fdiv_rn(a.y, s), __fdiv_rn(a.z, s), __fdiv_rn(a.w, s));
  }
  __device__ __forceinline__ float lse() const { return s > 0.f ? __fadd_rn(ms, logf(s)) : neg_inf(); }
};

// The fused q/k norm, RoPE and KV store of split_kv_qk_partials (split_kv_partials_impl<D, true>): the
// impl's q is then the qkv GEMM's raw query rows, k and v its raw K and V rows (token strides k_stride,
// v_stride); the rest is qk_norm_rope's arguments (rope.cu), k_store / v_store the caches written at
// slots[b]. Unused (null) in split_kv_partials.
struct DecodeQk {
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  int k_stride, v_stride;
  const __nv_bfloat16* q_w;
  const __nv_bfloat16* k_w;
  const float* cos_t;
  const float* sin_t;
  int max_pos;
  float eps;
  const int* positions;
  const int* slots;
  __nv_bfloat16* k_store;
  __nv_bfloat16* v_store;
  int cluster;  // the launch's splits of a sequence form one thread-block cluster: the fold through DSMEM
};

// Thread-block clusters (sm_90): the barrier over every thread of the cluster, with release / acquire
// semantics at cluster scope, and loads from another CTA's shared memory (DSMEM) at the same offset.
__device__ __forceinline__ void cluster_sync_release_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ u32 cluster_rank() {
  u32 r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
// the shared address `local` of this CTA as the same offset in cluster CTA `rank`
__device__ __forceinline__ u32 dsmem_addr(u32 local, u32 rank) {
  u32 a = local;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(local), "r"(rank));
#endif
  return a;
}
__device__ __forceinline__ float dsmem_f32(u32 a) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
#endif
  return v;
}
__device__ __forceinline__ float4 dsmem_f4(u32 a) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(a) : "memory");
#endif
  return v;
}

// The fold of split_kv_qk_partials in a cluster (DecodeQk::cluster): the launch's grid x (the splits of a
// sequence, at most kClusterMax) is one cluster, so split k is cluster rank k. Each live split has left its
// partial in its own shared memory -- o fp32 [nrows][D] at sP, lse at s_lse -- and the splits past the
// last live one have exited. Rank 0 folds splits 0 .. n_live-1 with split_kv_reduce's arithmetic (SplitFold:
// the maximum over the splits' lse, then the weighted sums in split order and one division; the same bits as
// the ticket's fold) from the others' shared memory, and writes out [nrows][D] bf16. The other ranks stay
// until it has read them (the second barrier). In place of the partials' round trip through L2, the
// ticket's atomic and the last CTA's loads: two cluster barriers and DSMEM loads.
constexpr int kClusterMax = 8;
template <int D>
__device__ __forceinline__ void cluster_fold(const __nv_bfloat16* sQ, const float* s_lse, int n_live, int nrows,
                                             __nv_bfloat16* __restrict__ out, int tid) {
  static_assert(DecodeCfg<D>::NQ * D * 4 <= 16 * DecodeCfg<D>::LD * 2, "a split's partial must fit in sQ");
  const float* sP = reinterpret_cast<const float*>(sQ);
  cluster_sync_release_acquire();  // every live split's partial is in its shared memory
  if (cluster_rank() != 0) {
    cluster_arrive_relaxed();  // ... and stays there until rank 0 has read it
    cluster_wait();
    return;
  }
  const u32 p_base = smem_u32(sP), l_base = smem_u32(s_lse);
  for (int i = tid; i < nrows * (D / 4); i += 128) {
    const int r = i / (D / 4), d4 = (i - r * (D / 4)) * 4;
    float lv[kClusterMax];
    float4 ov[kClusterMax];
#pragma unroll
    for (int j = 0; j < kClusterMax; ++j) {  // a split past n_live reads the last live one's, unused
      const u32 k = (u32)min(j, n_live - 1);
      lv[j] = dsmem_f32(dsmem_addr(l_base + r * 4, k));
      ov[j] = dsmem_f4(dsmem_addr(p_base + (r * D + d4) * 4, k));
    }
    float m = neg_inf();
#pragma unroll
    for (int j = 0; j < kClusterMax; ++j) m = fmaxf(m, lv[j]);  // the repeats change no maximum
    SplitFold f(m);
#pragma unroll
    for (int j = 0; j < kClusterMax; ++j)
      if (j < n_live) f.add(lv[j], ov[j]);
    const float4 oa = f.o();
    __nv_bfloat16* dst = out + r * D + d4;
    dst[0] = __float2bfloat16_rn(oa.x);
    dst[1] = __float2bfloat16_rn(oa.y);
    dst[2] = __float2bfloat16_rn(oa.z);
    dst[3] = __float2bfloat16_rn(oa.w);
  }
  cluster_arrive_relaxed();  // (each thread's loads were consumed above) the other ranks may exit
  cluster_wait();
}

// QK (split_kv_qk_partials, a decode step's attention with qk_norm_rope in the same launch): what the
// launch reads before its griddepcontrol.wait -- so while the qkv GEMM before it is still running -- is
// what that GEMM does not write: the lengths, positions, slots and block table (uploaded before the
// step), the norm weights and RoPE tables, and the cached K/V rows of the first two tiles except the row
// at position seq_lens[b] - 1, the one slot of the sequence this step writes. The earlier rows were
// written by an earlier step, which has completed: the kernel before this one (the GEMM) waited for its
// own predecessor before it let this one start (pdl.cuh). After the wait each warp normalizes and rotates
// its rows (qk_norm.cuh: qk_norm_rope's arithmetic): the group's query heads into sQ, and in the CTA whose
// split holds the new key, the K row with its V row into sQ rows NQ, NQ + 1 (free since keys became the
// MMAs' rows); there the new key's tile row is written from those rows instead of from the cache (when
// the block table puts position seq_lens[b] - 1 at slots[b], as a decode step does; otherwise the row is
// copied from the cache after the wait). The CTA of the split that holds position positions[b] (head
// group 0) also writes the K and V rows to the caches at slots[b] >= 0, the store qk_norm_rope makes.
// q and k in the qkv buffer are left as they are.
// EARLY (split_kv_early_partials, a decode step's attention after qk_norm_rope's own launch): the same reads
// before the wait, less the query, which the kernel before (qk_norm_rope) writes: the lengths and block table,
// and the cached K/V rows of the first two tiles except each sequence's last one (position seq_lens[b] - 1,
// which that kernel stores). After the wait: the query and, where the first two tiles hold it, the last row,
// both from memory. The bits are split_kv_partials': the same rows, loaded at other times.
template <int D, bool QK = false, bool EARLY = false>
__device__ __forceinline__ void split_kv_partials_impl(const __nv_bfloat16* __restrict__ q, int q_stride,
                                                       const __nv_bfloat16* __restrict__ k_cache,
                                                       const __nv_bfloat16* __restrict__ v_cache,
                                                       const int* __restrict__ block_tables, int max_blocks,
                                                       const int* __restrict__ seq_lens, float* __restrict__ o_part,
                                                       float* __restrict__ lse_part, int n_q, int n_kv, int block_size,
                                                       int split_size, int max_splits, float scale,
                                                       const int* __restrict__ row_seq, const float* __restrict__ cos_t,
                                                       const float* __restrict__ sin_t, int max_pos,
                                                       __nv_bfloat16* __restrict__ out, int* __restrict__ tickets,
                                                       const DecodeQk& qk = DecodeQk{}) {
  typedef DecodeCfg<D> C;
  constexpr int BN = C::BN, THREADS = C::THREADS, LD = C::LD, CH = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int NQ = C::NQ;
#ifndef TK_DIAG_SMEM64
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [16][LD], rows 0..NQ-1 used (QK: + 2)
  __nv_bfloat16* sK = sQ + 16 * LD;                                 // [2][BN][LD]
#else
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sQ = sK + BN * LD;
#endif
  __nv_bfloat16* sV = sK + 2 * BN * LD;                             // [2][BN][LD]
  const u32 sK_u = smem_u32(sK), sV_u = smem_u32(sV);               // the same, as shared addresses
  __shared__ float s_m[4][NQ];
  __shared__ float s_l[4][NQ];
  __shared__ float s_lse[NQ];  // QK with cluster: this split's lse per query row (its o in sQ)

  TRACE(0);  // after pdl_entry (QK: at the start)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = n_q / n_kv;
  const int HG = (G + NQ - 1) / NQ;
#ifdef TK_SPLIT_SLOWEST  // (lab switch: the split is the grid's slowest index, so the block order dispatches every
                         // sequence's split 0 before any split 1; the host launches (B, n_kv * HG, splits))
  const int split = blockIdx.z;
  const int b = blockIdx.x;
#else
  const int split = blockIdx.x;
  const int b = blockIdx.z;
#endif
  const int kvh = blockIdx.y / HG;
  const int hg = blockIdx.y - kvh * HG;
  const int h0 = kvh * G + hg * NQ;
  const int nrows = min(NQ, G - hg * NQ);
  const long long part = (long long)b * max_splits + split;  // (b, split) index

  // The prologue's loads go out together, none waiting on another: the sequence's length, the pages of
  // the first two tiles' rows (looked up before the length is known, for every row inside the table's
  // width), and Q by cp.async (its own commit group). The first K/V copies then wait on one round trip,
  // where a length -> Q -> block-table chain waited on three.
  const int* bt = block_tables + (long long)(row_seq != nullptr ? row_seq[b] : b) * max_blocks;
  const long long s0l = (long long)split * split_size;
  const int slen = seq_lens[b];
  const int bs_log2 = block_shift(block_size);
  int page = -1, blk = 0;  // the page of key s0 + tid (tid < 2 * BN)
  if (tid < 2 * BN && s0l + tid < (long long)max_blocks * block_size) {
    blk = block_of((int)s0l + tid, block_size, bs_log2);
    page = bt[blk];
  }
  // QK: this step's position and slot; the split that stores the K/V rows (the one holding the position)
  int p = -1, slot = -1;
  bool store = false;
  if constexpr (QK) {
    p = qk.positions[b];
    slot = qk.slots[b];
    store = hg == 0 && slot >= 0 && split == min(max(p, 0) / split_size, max_splits - 1);
  }
  // the query by cp.async (its own commit group; EARLY: after the wait, where the kernel before has written it)
  auto load_q = [&]() {
    for (int i = tid; i < NQ * CH; i += THREADS) {
      const int r = i / CH, c = i % CH;
      const bool skip = r >= nrows;  // rows past the group's heads are zeros
      cp_async16_or_zero(smem_u32(sQ + r * LD + c * 8),
                         q + (long long)b * q_stride + (long long)(h0 + (skip ? 0 : r)) * D + c * 8, skip);
    }
    cp_async_commit();
  };
  if constexpr (!QK && !EARLY) load_q();
  // QK: the rows of a warp's norm jobs (job warp + 4i: query head h0 + job below nrows, the K head at nrows)
  constexpr int JM = (NQ + 1 + 3) / 4;
  constexpr int HALF = D / 2;
  QkRow rows[JM];
  const bool rot = QK && p >= 0 && p < qk.max_pos;
  // the norm jobs j0 .. njobs-1 after the wait: x loads for all of the warp's jobs first, then each row's
  // reduction and output; the K row (with its V row) goes to sQ rows NQ, NQ + 1 and, in the storing CTA,
  // to the caches
  auto norm_jobs = [&](int j0, int njobs) {
#pragma unroll
    for (int i = 0; i < JM; ++i) {
      const int job = warp + 4 * i;
      if (job >= j0 && job < njobs)
        qk_row_x(rows[i], job < nrows ? q + (long long)b * q_stride + (long long)(h0 + job) * D
                                      : qk.k + (long long)b * qk.k_stride + (long long)kvh * D, lane, HALF);
    }
    __nv_bfloat16 va[4], vb[4];
    const bool kjob = warp == nrows % 4 && nrows < njobs;  // this warp has the K head's job
    if (kjob) qk_row_v(va, vb, qk.v + (long long)b * qk.v_stride + (long long)kvh * D, lane, HALF);
#pragma unroll
    for (int i = 0; i < JM; ++i) {
      const int job = warp + 4 * i;
      if (job < j0 || job >= njobs) continue;
      const float inv = qk_row_inv_rms(rows[i], lane, HALF, D, qk.eps);
      __nv_bfloat16* dst = sQ + (job < nrows ? job : NQ) * LD;
      const long long gdst = (long long)slot * n_kv * D + (long long)kvh * D;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = lane + 32 * c;
        if (j < HALF) {
          __nv_bfloat16 ra, rb;
          qk_row_out(rows[i], inv, rot, c, ra, rb);
          dst[j] = ra;
          dst[j + HALF] = rb;
          if (job == nrows) {
            dst[LD + j] = va[c];
            dst[LD + j + HALF] = vb[c];
            if (store) {
              qk.k_store[gdst + j] = ra;
              qk.k_store[gdst + j + HALF] = rb;
              qk.v_store[gdst + j] = va[c];
              qk.v_store[gdst + j + HALF] = vb[c];
            }
          }
        }
      }
    }
  };
  auto job_weights = [&](int j0, int njobs) {
#pragma unroll
    for (int i = 0; i < JM; ++i) {
      const int job = warp + 4 * i;
      if (job >= j0 && job < njobs) {
        qk_row_weight(rows[i], job < nrows ? qk.q_w : qk.k_w, lane, HALF);
        if (rot) qk_row_tables(rows[i], qk.cos_t, qk.sin_t, p, lane, HALF);
      }
    }
  };
  if (s0l >= slen) {  // empty split (uniform across the CTA)
    if constexpr (QK) {  // nothing to attend; the store, if this CTA makes it (the K job only)
      if (store) job_weights(nrows, nrows + 1);
      pdl_entry();
      if (store) norm_jobs(nrows, nrows + 1);
    } else if constexpr (EARLY) {
      pdl_entry();
    }
    TRACE(7);
    cp_async_wait<0>();
    if (out != nullptr) {  // fused: nothing to fold; an empty sequence's output is zeros (split 0 writes them)
      if (split == 0)
        for (int i = tid; i < nrows * D; i += THREADS) out[((long long)b * n_q + h0) * D + i] = __float2bfloat16_rn(0.f);
      return;
    }
    for (int i = tid; i < nrows * D; i += THREADS) o_part[(part * n_q + h0) * D + i] = 0.f;
    if (tid < nrows) lse_part[part * n_q + h0 + tid] = neg_inf();
    return;
  }
  const int s0 = (int)s0l;
  const int s1 = (int)min((long long)slen, s0l + split_size);
  const int n_live = (int)min((long long)max_splits, (slen + (long long)split_size - 1) / split_size);  // splits with keys
  const bool direct = out != nullptr && n_live == 1;  // fused with one live split: no partials at all

  const int ntiles = (s1 - s0 + BN - 1) / BN;
  __shared__ int s_off[2][BN];  // row-offset tables of two K/V tiles (load_kv_tile)
  if (tid < 2 * BN) s_off[tid / BN][tid % BN] = slot_chunk(page, s0 + tid, blk, s1, n_kv, D, block_size);  // tiles 0, 1
  // QK: the new key's tile lt and row lr (lt = -1: not in this split), and whether the table puts it at
  // the slot this step writes (subst: its tile row comes from the new K/V rows, not from the cache)
  int lt = -1, lr = 0, late_off = -1;
  int njobs = nrows;  // QK: the norm jobs, its query heads and the K head where it holds the new key or stores
  if constexpr (QK) {
    if (slot >= 0 && p == slen - 1 && p >= s0 && p < s1) {
      lt = (p - s0) / BN;
      lr = p - s0 - lt * BN;
      late_off = row_offset(bt, p, s1, n_kv, D, block_size, bs_log2);
    }
    njobs += lt >= 0 || store ? 1 : 0;
    job_weights(0, njobs);
  } else if constexpr (EARLY) {  // the last key, which the kernel before has just stored, if tile 0 or 1 holds it
    const int p_new = slen - 1;
    if (p_new >= s0 && p_new < s1 && p_new - s0 < 2 * BN) {
      lt = (p_new - s0) / BN;
      lr = p_new - s0 - lt * BN;
      late_off = row_offset(bt, p_new, s1, n_kv, D, block_size, bs_log2);
    }
  }
  __syncthreads();
  TRACE(1);  // the length and the first pages have arrived
#ifdef TK_DIAG_REGLOAD
#ifndef TK_DIAG_COPY_ONLY
#error "TK_DIAG_REGLOAD is a copies-only build: -DTK_DIAG_COPY_ONLY too"
#endif
  KvRegs<D, BN, THREADS> ra, rb;  // two K/V tiles in flight, in registers
  u32 diag_acc = 0;
#endif
  if constexpr (QK || EARLY) {  // tiles 0 and 1 before the wait, less the new (EARLY: the last) key's row
    load_kv_tile<D, BN, THREADS, true, true>(sK, sV, k_cache, v_cache, s_off[0], kvh, tid, lt == 0 ? lr : -1);
    if (ntiles > 1)
      load_kv_tile<D, BN, THREADS, true, true>(sK + BN * LD, sV + BN * LD, k_cache, v_cache, s_off[1], kvh, tid,
                                               lt == 1 ? lr : -1);
    cp_async_commit();
    pdl_entry();
    if constexpr (QK) {
      norm_jobs(0, njobs);
      for (int i = tid; i < (NQ - nrows) * D; i += THREADS)  // query rows past the group's heads are zeros
        sQ[(nrows + i / D) * LD + i % D] = __float2bfloat16_rn(0.f);
    } else {
      load_q();  // EARLY: the query, which the kernel before has written
    }
  } else {
#ifdef TK_DIAG_REGLOAD
    ldg_kv_tile<D, BN, THREADS>(ra, k_cache, v_cache, s_off[0], kvh, tid);  // (diagnostic: tile 0 into registers)
#else
    load_kv_tile<D, BN, THREADS, true>(sK, sV, k_cache, v_cache, s_off[0], kvh, tid);
#endif
    cp_async_commit();
  }
  const bool subst = QK && lt >= 0 && late_off >= 0 && late_off == slot * (n_kv * CH);
  // QK: the new key's row of tile lt, in stage st: from sQ rows NQ, NQ + 1 (subst), else from the cache
  auto fill_new_row = [&](int st) {
    if (tid < CH) {
      const int o = (st * BN + lr) * LD + tid * 8;
      if (subst) {
        *reinterpret_cast<uint4*>(sK + o) = *reinterpret_cast<const uint4*>(sQ + NQ * LD + tid * 8);
        *reinterpret_cast<uint4*>(sV + o) = *reinterpret_cast<const uint4*>(sQ + (NQ + 1) * LD + tid * 8);
      } else {
        const u32 off = (u32)max(late_off, 0);
        cp_async16_or_zero<true>(smem_u32(sK + o), reinterpret_cast<const uint4*>(k_cache + (kvh * D + tid * 8)) + off,
                                 late_off < 0);
        cp_async16_or_zero<true>(smem_u32(sV + o), reinterpret_cast<const uint4*>(v_cache + (kvh * D + tid * 8)) + off,
                                 late_off < 0);
      }
    }
  };

  if constexpr (QK) {
    __syncthreads();  // the norm jobs' rows are in sQ
    if (lt == 0 || lt == 1) fill_new_row(lt);
    cp_async_commit();
    cp_async_wait<0>();  // tiles 0, 1 and the new key's row have landed
  } else if constexpr (EARLY) {
    if (lt == 0 || lt == 1) fill_new_row(lt);  // from the cache (subst is QK's only)
    cp_async_commit();
    cp_async_wait<0>();  // tiles 0, 1, Q and the last key's row have landed
  } else {
    cp_async_wait<1>();  // Q has landed (the first K/V tile may still be in flight)
  }
  __syncthreads();
  u32 qb[D / 16][2];
  load_qt_frags<D>(qb, smem_u32(sQ), lane);

  float o[D / 16][4];  // O^T: dims 16mt + g (+8) x queries 2t, 2t+1
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  float m_[2] = {neg_inf(), neg_inf()};  // queries 2t, 2t+1
  float l_[2] = {0.f, 0.f};
  const float sl2 = scale * kLog2e;
  const int lim = s1 - 1;  // every key of the split is visible

  for (int j = 0; j < ntiles; ++j) {
    const int st = j & 1;
    // row tid of tile j + 2: page read now, table entry written at the end of the iteration (as in paged_prefill)
    const int ahead = s0 + (j + 2) * BN + tid;
    const int ahead_page = (tid < BN && j + 2 < ntiles) ? row_page(bt, ahead, s1, block_size, bs_log2) : -1;
#ifdef TK_DIAG_REGLOAD  // (copies only, two tiles in registers: tile j + 1 loaded, tile j consumed)
    if constexpr (!QK) {
      auto consume = [&](const KvRegs<D, BN, THREADS>& t) {
#if TK_DIAG_REGLOAD == 2  // stored where the copies would have put them
        sts_kv_tile<D, BN, THREADS, LD>(t, sK + st * BN * LD, sV + st * BN * LD, tid);
#else  // folded into one word
#pragma unroll
        for (int i = 0; i < KvRegs<D, BN, THREADS>::ROWS; ++i)
          diag_acc ^= t.k[i].x ^ t.k[i].y ^ t.k[i].z ^ t.k[i].w ^ t.v[i].x ^ t.v[i].y ^ t.v[i].z ^ t.v[i].w;
#endif
      };
      if (st == 0) {
        if (j + 1 < ntiles) ldg_kv_tile<D, BN, THREADS>(rb, k_cache, v_cache, s_off[1], kvh, tid);
        consume(ra);
      } else {
        if (j + 1 < ntiles) ldg_kv_tile<D, BN, THREADS>(ra, k_cache, v_cache, s_off[0], kvh, tid);
        consume(rb);
      }
    } else
#endif
    {
      if (j + 1 < ntiles && (!(QK || EARLY) || j + 1 >= 2)) {  // (QK, EARLY: tile 1 went out before the wait)
        if constexpr (QK) {
          const bool mine = subst && j + 1 == lt;
          load_kv_tile<D, BN, THREADS, true, true>(sK + (st ^ 1) * BN * LD, sV + (st ^ 1) * BN * LD, k_cache, v_cache,
                                                   s_off[st ^ 1], kvh, tid, mine ? lr : -1);
          if (mine) fill_new_row(st ^ 1);
        } else {
          load_kv_tile<D, BN, THREADS, true>(sK + (st ^ 1) * BN * LD, sV + (st ^ 1) * BN * LD, k_cache, v_cache,
                                             s_off[st ^ 1], kvh, tid);
        }
      }
      cp_async_commit();
      cp_async_wait<1>();
    }
    __syncthreads();
    if (j == 0) TRACE(2);  // the first K/V tile has landed
    if (cos_t != nullptr) {  // fused RoPE (uniform branch)
      rotate_k_tile<D, BN, THREADS>(sK + st * BN * LD, s0 + j * BN, s1, cos_t, sin_t, max_pos, tid);
      __syncthreads();
    }
#ifndef TK_DIAG_COPY_ONLY  // (diagnostic builds of the device scripts: wrong outputs, timing only)
#ifdef TK_DIAG_FREE_TILE  // (diagnostic: one tile of each CTA without arithmetic: 1 the last, 2 the first)
    if (TK_DIAG_FREE_TILE == 1 ? j + 1 < ntiles : j > 0) {
#endif
    float s[4];
    tile_scores_t<D>(qb, sK_u + (st * BN + warp * 16) * LD * 2, lane, s);
    const int key0 = s0 + j * BN + warp * 16 + (lane >> 2);  // this lane's first key (row g)
    // the warp's 16 keys all visible: a warp-uniform condition, voted so that the compiler knows it is
    if (__all_sync(0xffffffffu, s0 + j * BN + warp * 16 + 15 <= lim))
      online_softmax_t<D, false>(s, key0, lim, sl2, m_, l_, o);
    else
      online_softmax_t<D, true>(s, key0, lim, sl2, m_, l_, o);
#ifndef TK_DIAG_NO_PV
    tile_pv_t<D>(s, sV_u + (st * BN + warp * 16) * LD * 2, lane, o);
#else
    o[0][0] += s[0] + s[1] + s[2] + s[3];
#endif
#ifdef TK_DIAG_FREE_TILE
    }
#endif
#endif
    if (tid < BN && j + 2 < ntiles)  // row tid of tile j + 2 -> s_off[st], for the next iteration's copies
      s_off[st][tid] = slot_chunk(ahead_page, ahead, block_of(ahead, block_size, bs_log2), s1, n_kv, D, block_size);
    __syncthreads();
  }

#ifdef TK_DIAG_REGLOAD
  if (diag_acc == 0x9e3779b9u) o[0][0] += 1.f;  // (the loads' words live on)
#endif
  TRACE(3);  // the key loop is done
  // Merge the 4 warp states (fixed order) through shared memory (the stage buffers are free now).
  constexpr int OLD = C::OLD;
  float* sO = reinterpret_cast<float*>(sK);  // [4][NQ][OLD]
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float l = l_[e];  // this lane's partial sum -> the warp's, over the 8 lanes of query 2t + e
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    if (g == 0) {
      s_m[warp][2 * t + e] = m_[e];
      s_l[warp][2 * t + e] = l;
    }
    float* row = sO + (warp * NQ + 2 * t + e) * OLD + g;
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      row[mt * 16] = o[mt][e];
      row[mt * 16 + 8] = o[mt][2 + e];
    }
  }
  __syncthreads();
  for (int i = tid; i < nrows * D; i += THREADS) {
    const int r = i / D, d = i - r * D;
    float M = s_m[0][r];
#pragma unroll
    for (int w = 1; w < 4; ++w) M = fmaxf(M, s_m[w][r]);
    const float Ms = (M == neg_inf()) ? 0.f : M;
    float Lsum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float e = exp2f(s_m[w][r] - Ms);  // 0 for a warp that saw no key
      Lsum += e * s_l[w][r];
      acc += e * sO[(w * NQ + r) * OLD + d];
    }
    const float ov = Lsum > 0.f ? acc / Lsum : 0.f;
    if (direct) {  // fused, one split: this is the answer (the reduce of one split is the identity)
      out[((long long)b * n_q + h0 + r) * D + d] = __float2bfloat16_rn(ov);
      continue;
    }
    if constexpr (QK)
      if (qk.cluster) {  // the partial stays in shared memory (sQ's bytes, free since Q is in registers)
        reinterpret_cast<float*>(sQ)[r * D + d] = ov;
        if (d == 0) s_lse[r] = Lsum > 0.f ? (Ms + log2f(Lsum)) * kLn2 : neg_inf();
        continue;
      }
    o_part[(part * n_q + h0 + r) * D + d] = ov;
    if (d == 0) lse_part[part * n_q + h0 + r] = Lsum > 0.f ? (Ms + log2f(Lsum)) * kLn2 : neg_inf();
  }
  TRACE(4);  // the warps' states are merged and written
  if (out == nullptr || direct) {
    TRACE(7);
    return;
  }
  if constexpr (QK)
    if (qk.cluster) {  // the fold in the cluster
      cluster_fold<D>(sQ, s_lse, n_live, nrows, out + ((long long)b * n_q + h0) * D, tid);
      TRACE(7);
      return;
    }

  // Fused reduce: the last of the sequence's n_live CTAs (for these heads) to finish folds the splits
  // 0, 1, ..., n_live-1 with split_kv_reduce's arithmetic (SplitFold; folding the empty splits past
  // n_live would change no bit), then leaves the ticket at zero for the next launch.
  // Ordering: the CTA barrier puts every thread's partials before thread 0's ticket, which it takes with
  // one acquire-release atomic at GPU scope: release makes them (cumulatively) visible before the ticket,
  // acquire puts the last CTA's reads of the other CTAs' partials after it, and the barrier after it
  // extends that to every thread (the pattern of a grid barrier). A sequentially consistent fence in
  // every thread (__threadfence: MEMBAR.SC.GPU and an L1 invalidate, twice) cost more than the ticket.
  __shared__ int s_last;
  __syncthreads();
  if (tid == 0) {
    int* tk = tickets + (long long)b * gridDim.y + blockIdx.y;
    s_last = atomic_add_acq_rel_gpu(tk, 1) == n_live - 1;
    if (s_last) *tk = 0;
  }
  __syncthreads();
  TRACE(5);  // the ticket is known
  if (!s_last) {
    TRACE(7);
    return;
  }
  // four adjacent dims per thread (float4); the loads of PF splits go out together (16: the `auto`
  // rule's most splits, so its fold waits on one round of loads); with more splits, a second pass over
  // the rest's lse for the maximum, then their states in rounds of PF
  constexpr int PF = D >= 128 ? 16 : 8;
  for (int i = tid; i < nrows * (D / 4); i += THREADS) {
    const int r = i / (D / 4), d4 = (i - r * (D / 4)) * 4;
    const long long bh = (long long)b * max_splits * n_q + h0 + r;  // (b, split 0, head)
    float lv[PF];
    float4 ov[PF];
    // splits k0 .. k0+PF-1 into lv, ov (a split past n_live reads the last live one's, unused)
    auto load_round = [&](int k0) {
#pragma unroll
      for (int j = 0; j < PF; ++j) {
        const long long k = min(k0 + j, n_live - 1);
        lv[j] = __ldcg(lse_part + bh + k * n_q);
        ov[j] = __ldcg(reinterpret_cast<const float4*>(o_part + (bh + k * n_q) * D + d4));
      }
    };
    load_round(0);
    float m = neg_inf();
#pragma unroll
    for (int j = 0; j < PF; ++j) m = fmaxf(m, lv[j]);  // the repeats past n_live change no maximum
    for (int k0 = PF; k0 < n_live; k0 += PF) {  // more splits than one round: the rest's maxima first
      float l2[PF];
#pragma unroll
      for (int j = 0; j < PF; ++j) l2[j] = __ldcg(lse_part + bh + (long long)min(k0 + j, n_live - 1) * n_q);
#pragma unroll
      for (int j = 0; j < PF; ++j) m = fmaxf(m, l2[j]);
    }
    SplitFold f(m);
    for (int k0 = 0; k0 < n_live; k0 += PF) {  // round 0 is in registers already
      if (k0 > 0) load_round(k0);
#pragma unroll
      for (int j = 0; j < PF; ++j)
        if (k0 + j < n_live) f.add(lv[j], ov[j]);
    }
    const float4 oa = f.o();
    __nv_bfloat16* dst = out + ((long long)b * n_q + h0 + r) * D + d4;
    dst[0] = __float2bfloat16_rn(oa.x);
    dst[1] = __float2bfloat16_rn(oa.y);
    dst[2] = __float2bfloat16_rn(oa.z);
    dst[3] = __float2bfloat16_rn(oa.w);
  }
  TRACE(7);  // the fold is written
}

}  // namespace

// NAME, head dim, keys per tile, query rows per CTA, 16-row tiles per warp, min CTAs per multiprocessor
#define TK_PREFILL(NAME, DV, BNV, BMV, MTV, MINB)                                                             \
  extern "C" __global__ void __launch_bounds__(2 * BMV / MTV, MINB) NAME(                                       \
      const __nv_bfloat16* __restrict__ q, int q_stride, const __nv_bfloat16* __restrict__ k_cache,           \
      const __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,         \
      const int* __restrict__ seq_lens, const int* __restrict__ q_seq_idx, const int* __restrict__ q_pos,      \
      __nv_bfloat16* __restrict__ out, int T, int B, int n_q, int n_kv, int block_size, float scale,          \
      const float* __restrict__ cos_t, const float* __restrict__ sin_t, int max_pos) { pdl_entry();           \
    paged_prefill_impl<DV, BNV, BMV, MTV>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, seq_lens,    \
                                          q_seq_idx, q_pos, out, T, B, n_q, n_kv, block_size, scale, cos_t,     \
                                          sin_t, max_pos);                                                      \
  }
TK_PREFILL(paged_prefill_d16, 16, 64, 64, 1, 1)
TK_PREFILL(paged_prefill_d32, 32, 64, 64, 1, 1)
TK_PREFILL(paged_prefill_d64, 64, 64, 64, 1, 1)
TK_PREFILL(paged_prefill_d128, 128, 64, 64, 1, 1)
TK_PREFILL(paged_prefill_d64_x2, 64, 64, 128, 2, 2)
TK_PREFILL(paged_prefill_d128_x2, 128, 64, 128, 2, 2)
// The wgmma kernels exist only in an sm_90a build (optimized/kernels/__init__.py builds this file so on a
// compute-capability-9.0 device; ops.PREFILL_VARIANTS lists them as "wg64" and "wg128", and ops launches
// them only on such a build). Elsewhere each symbol stays, with a body that traps, so that every build
// has the same kernel names and signatures.
#ifdef TK_WGMMA
#define TK_PREFILL_WG_BODY(BMV)                                                                                 \
  paged_prefill_impl<128, 64, BMV, 1, true>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, seq_lens,  \
                                            q_seq_idx, q_pos, out, T, B, n_q, n_kv, block_size, scale, cos_t,   \
                                            sin_t, max_pos);
#else
#define TK_PREFILL_WG_BODY(BMV) __trap();  // not an sm_90a build: ops never launches it
#endif
// NAME, query rows per CTA (one warpgroup per 64), min CTAs per multiprocessor; head dim 128, 64 keys a tile
#define TK_PREFILL_WG(NAME, BMV, MINB)                                                                        \
  extern "C" __global__ void __launch_bounds__(2 * BMV, MINB) NAME(                                             \
      const __nv_bfloat16* __restrict__ q, int q_stride, const __nv_bfloat16* __restrict__ k_cache,           \
      const __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,         \
      const int* __restrict__ seq_lens, const int* __restrict__ q_seq_idx, const int* __restrict__ q_pos,      \
      __nv_bfloat16* __restrict__ out, int T, int B, int n_q, int n_kv, int block_size, float scale,          \
      const float* __restrict__ cos_t, const float* __restrict__ sin_t, int max_pos) { pdl_entry();           \
    TK_PREFILL_WG_BODY(BMV)                                                                                     \
  }
TK_PREFILL_WG(paged_prefill_d128_wg64, 64, 2)
TK_PREFILL_WG(paged_prefill_d128_wg128, 128, 1)
// The warp-specialised wgmma kernel: 384 threads (a producer warpgroup and two consumers), one CTA a
// multiprocessor; ops.PREFILL_VARIANTS lists it as "ws".
#ifdef TK_WGMMA
#define TK_PREFILL_WS_BODY                                                                                      \
  paged_prefill_ws_impl<128, 64>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, seq_lens, q_seq_idx,  \
                                 q_pos, out, T, B, n_q, n_kv, block_size, scale, cos_t, sin_t, max_pos);
#else
#define TK_PREFILL_WS_BODY __trap();  // not an sm_90a build: ops never launches it
#endif
extern "C" __global__ void __launch_bounds__(384, 1) paged_prefill_d128_ws(
    const __nv_bfloat16* __restrict__ q, int q_stride, const __nv_bfloat16* __restrict__ k_cache,
    const __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ seq_lens, const int* __restrict__ q_seq_idx, const int* __restrict__ q_pos,
    __nv_bfloat16* __restrict__ out, int T, int B, int n_q, int n_kv, int block_size, float scale,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, int max_pos) {
  pdl_entry();
  TK_PREFILL_WS_BODY
}

// head dim, min CTAs per multiprocessor (d16/d32: 4, which also keeps ptxas from a 4-byte spill it
// otherwise chose at ~70 registers). split_kv_partials_d{D} waits first (ENTRY: pdl_entry();). Its early twin
// split_kv_early_partials_d{D} (split_kv_partials_impl<D, false, true>; ENTRY empty, the wait inside the impl) is
// for a decode step after qk_norm_rope's own launch: the same arguments (row_seq null: one query row per sequence,
// whose last key is the one the kernel before stored) and bits; its first two tiles' cached rows but the last
// key's are read before the wait.
#define TK_SPLITKV_K(NAME, DV, MINB, EARLYV, ENTRY)                                                               \
  extern "C" __global__ void __launch_bounds__(128, MINB) NAME##_d##DV(                                            \
      const __nv_bfloat16* __restrict__ q, int q_stride, const __nv_bfloat16* __restrict__ k_cache,              \
      const __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,            \
      const int* __restrict__ seq_lens, float* __restrict__ o_part, float* __restrict__ lse_part, int n_q,        \
      int n_kv, int block_size, int split_size, int max_splits, float scale, const int* __restrict__ row_seq,     \
      const float* __restrict__ cos_t, const float* __restrict__ sin_t, int max_pos,                             \
      __nv_bfloat16* __restrict__ out, int* __restrict__ tickets) { ENTRY                                        \
    split_kv_partials_impl<DV, false, EARLYV>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, seq_lens,  \
                                              o_part, lse_part, n_q, n_kv, block_size, split_size, max_splits,   \
                                              scale, row_seq, cos_t, sin_t, max_pos, out, tickets);             \
  }
#define TK_SPLITKV(DV, MINB)                                  \
  TK_SPLITKV_K(split_kv_partials, DV, MINB, false, pdl_entry();) \
  TK_SPLITKV_K(split_kv_early_partials, DV, MINB, true, )
TK_SPLITKV(16, 4)
TK_SPLITKV(32, 4)
TK_SPLITKV(64, 1)
TK_SPLITKV(128, 1)

// split_kv_partials with qk_norm_rope in the launch (split_kv_partials_impl<D, true>, DecodeQk): q, k, v
// the qkv GEMM's raw head rows; the rest as split_kv_partials (one query row per sequence: no row_seq,
// no fused K rotation) and qk_norm_rope (store=(v, k_cache, v_cache, slots)). Its first statement is
// the impl: the prologue's loads come before the wait (pdl_entry inside).
#define TK_SPLITKV_QK(DV, MINB)                                                                                    \
  extern "C" __global__ void __launch_bounds__(128, MINB) split_kv_qk_partials_d##DV(                              \
      const __nv_bfloat16* __restrict__ q, int q_stride, const __nv_bfloat16* __restrict__ k, int k_stride,       \
      const __nv_bfloat16* __restrict__ v, int v_stride, const __nv_bfloat16* __restrict__ q_w,                   \
      const __nv_bfloat16* __restrict__ k_w, const float* __restrict__ cos_t, const float* __restrict__ sin_t,     \
      int max_pos, float eps, const int* __restrict__ positions, const int* __restrict__ slots,                   \
      __nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,                                   \
      const int* __restrict__ block_tables, int max_blocks, const int* __restrict__ seq_lens,                      \
      float* __restrict__ o_part, float* __restrict__ lse_part, int n_q, int n_kv, int block_size,                \
      int split_size, int max_splits, float scale, __nv_bfloat16* __restrict__ out, int* __restrict__ tickets,    \
      int cluster) {                                                                                                \
    split_kv_partials_impl<DV, true>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, seq_lens, o_part,    \
                                     lse_part, n_q, n_kv, block_size, split_size, max_splits, scale, nullptr,     \
                                     nullptr, nullptr, 0, out, tickets,                                           \
                                     DecodeQk{k, v, k_stride, v_stride, q_w, k_w, cos_t, sin_t, max_pos, eps,     \
                                              positions, slots, k_cache, v_cache, cluster});                      \
  }
TK_SPLITKV_QK(16, 4)
TK_SPLITKV_QK(32, 4)
TK_SPLITKV_QK(64, 1)
TK_SPLITKV_QK(128, 1)

// ------------------------------------------------------------------------------------------------
// split_kv_reduce
//
// Math (twin: reference reduce_splits): fold splits 0 .. max_splits-1 of every (b, h) (SplitFold: the
// maximum of their lse, then the weights and the weighted states summed in index order, one division;
// guards: an all -inf max is taken as 0; a zero weight sum gives o = 0, lse = -inf). An empty split
// changes neither the maximum nor the sums, so folding all max_splits columns equals folding a
// sequence's own ceil(len / S) splits, bit for bit.
// o_part fp32 [B, MS, n_q, D], lse_part fp32 [B, MS, n_q] -> out bf16 [B, n_q, D] (+ optional lse_out
// fp32 [B, n_q], skipped when null). One thread per (b, h, 4 dims); D % 4 == 0.
// ------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(256) split_kv_reduce(const float* __restrict__ o_part,
                                                                  const float* __restrict__ lse_part,
                                                                  __nv_bfloat16* __restrict__ out,
                                                                  float* __restrict__ lse_out, int B, int n_q, int D,
                                                                  int max_splits) {
  pdl_entry();
  const int D4 = D >> 2;
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long long)B * n_q * D4) return;
  const int d4 = (int)(idx % D4);
  const long long bh = idx / D4;
  const long long b = bh / n_q, h = bh % n_q;
  const long long stride_k = (long long)n_q;  // lse stride between splits
  const float* lp = lse_part + b * max_splits * n_q + h;
  const float* op = o_part + (b * max_splits * n_q + h) * D + d4 * 4;
  float m = neg_inf();
#pragma unroll 4
  for (int k = 0; k < max_splits; ++k) m = fmaxf(m, lp[k * stride_k]);
  SplitFold f(m);
#pragma unroll 4
  for (int k = 0; k < max_splits; ++k) f.add(lp[k * stride_k], *reinterpret_cast<const float4*>(op + k * stride_k * D));
  const float4 oa = f.o();
  const float la = f.lse();
  __nv_bfloat162 lo = __floats2bfloat162_rn(oa.x, oa.y);
  __nv_bfloat162 hi = __floats2bfloat162_rn(oa.z, oa.w);
  uint2 pk;
  pk.x = *reinterpret_cast<u32*>(&lo);
  pk.y = *reinterpret_cast<u32*>(&hi);
  *reinterpret_cast<uint2*>(out + bh * D + d4 * 4) = pk;
  if (lse_out != nullptr && d4 == 0) lse_out[bh] = la;
}

// ------------------------------------------------------------------------------------------------
// merge_states
//
// Math (twin: reference merge_states, after its sort / duplicate checks, which stay in Python):
// fold N fp32 partial states o [N, R, D], lse [N, R] in the given order with merge_two
// -> o_out fp32 [R, D], lse_out fp32 [R]. One thread per (r, d).
// ------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(256) merge_states(const float* __restrict__ o, const float* __restrict__ lse,
                                                               float* __restrict__ o_out, float* __restrict__ lse_out,
                                                               int N, int R, int D) {
  pdl_entry();
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long long)R * D) return;
  const long long r = idx / D;
  const int d = (int)(idx % D);
  float la = lse[r];
  float oa = o[idx];
  for (int n = 1; n < N; ++n) {
    const float lb = lse[(long long)n * R + r];
    const float ob = o[(long long)n * R * D + idx];
    const MergeW w = merge_weights(la, lb);
    oa = merge_o(oa, ob, w);
  }
  o_out[idx] = oa;
  if (d == 0) lse_out[r] = la;
}
