// sampling.cu -- greedy / temperature + top-k + top-p sampling with counter-based Gumbel noise.
//
// Reference twin: reference/sampling.py, sample_one. Two kernels per call:
//   sample_partial  grid (C, B), 256 threads: CTA (c, b) reads chunk c of row b (CHUNK = 4096
//                   logits, C = ceil(V / CHUNK)) once and writes a Partial: the chunk's max, its
//                   argmax and sum exp(x - max); for a "plain" row (temperature > 0, top-k and top-p
//                   off: the usual RL setting) also the chunk's Gumbel-max candidate and, for a
//                   processed logprob, sum exp(l - max l); for a "candidate" row (0 < top-k <=
//                   TOPK_CAP) the chunk's entries that reach its own k-th largest logit (Cand).
//   sample          grid (B), 1024 threads: folds the C partials of its row with a fixed tree, and
//                   finishes greedy and plain rows from them; a row with top-k or top-p runs the
//                   filters' passes in this one CTA (below), over its gathered candidates if it has
//                   them, else over the whole row.
// The chunks are a function of V alone and every fold has a fixed order, so a row's result is
// reproducible run to run and independent of the other rows of the batch.
//
//   greedy (temperature <= 0): token = argmax(logits), lowest index on ties; logprob raw.
//   otherwise, in fp32:
//     l_i   = logits_i / T                                  (IEEE division)
//     top-k (0 < k < V): keep l_i >= kth, kth = the k-th largest l counting ties
//           -> kth = (k-th largest logit) / T exactly (x -> x / T is monotone, so it maps the
//              order statistics of the logits onto those of l), found by a 3-pass radix select
//              (11/11/10-bit digits) on order-preserving uint32 keys of the raw logits; no sort.
//     top-p (p < 1): q_i = exp(l_i - M) / Z over the top-k survivors (M = max l); keep q_i >= tau,
//           tau = the largest survivor probability t with mass(q >= t) >= p
//           -> found by a 3-pass radix search over the bit patterns of q (non-negative floats sort
//              like their bits) with per-bin masses in 2^-52 fixed point, summed with integer
//              atomics (deterministic). Entries with q < (1 - p) / (2V) cannot reach tau (their
//              total mass is below (1 - p) / 2) and are left out of the histograms. If rounding
//              leaves the total below p, every survivor is kept (as the reference's clamp does).
//     token = argmax over survivors of l_i + g_i, lowest index on ties, with
//       mix(x): x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16  (uint32)
//       h   = mix(mix(mix(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ pos)
//       r_i = mix(mix(h ^ i) + 0x632BE5AB);  u_i = ((r_i >> 9) + 0.5f) * 2^-23;  g_i = -log(-log(u_i))
//   logprob: mode 0 (raw) = log_softmax(logits)[token];
//            mode 1 (processed) = log_softmax over the survivors of l, at the token (= raw when greedy).
//
// All reductions use a fixed tree or integer atomics (no float atomics). Passes over the row: 1
// (in sample_partial, spread over C CTAs) plus, for a filtered row without candidates, up to 8 in
// the one CTA of sample (top-k: 3, top-p: 4, the final Gumbel pass: 1); each of those streams the
// row with 16-byte loads, 4 in flight per thread, uniform trip counts. With candidates the same
// passes read at most NCAND entries from shared memory.
// logits fp32 [B, V] (row stride ld, V <= 2^30); per-row parameter arrays of length B; outputs
// int32 / fp32 [B]; scratch: Partial [B, C], Cand [B, C, SLOTS]. A NaN logit whose key is all ones
// reads as past-the-end in a candidate row's chunk (garbage in, as anywhere else).

#include <cuda_bf16.h>

#include "pdl.cuh"

namespace {

typedef unsigned int u32;
typedef unsigned long long u64;

constexpr int THREADS = 1024;                      // sample: one CTA per row
constexpr int NWARP = THREADS / 32;
constexpr int PART_THREADS = 256;                  // sample_partial: one CTA per chunk of a row
constexpr int PER_THREAD = 16;                     // logits per sample_partial thread
constexpr int CHUNK = PART_THREADS * PER_THREAD;   // 4096 (ops.SAMPLE_CHUNK)
constexpr int TOPK_CAP = 64;                       // top-k rows with k <= this use the candidate path
constexpr int SLOTS = 128;                         // candidates a chunk may export (ops.SAMPLE_SLOTS)
constexpr int NCAND = 3072;                        // candidates a row may gather in shared memory
constexpr u32 NONE = 0xffffffffu;

// What sample_partial leaves for sample: one chunk of one row (32 bytes).
struct Partial {
  float m;   // max logit of the chunk
  float s;   // sum exp(x - m) over the chunk
  int bi;    // index of the max (lowest on ties)
  float z;   // plain rows with a processed logprob: sum exp(l - m / T), l = x / T
  float g;   // plain rows: max of l + gumbel over the chunk
  int gi;    // its index (lowest on ties)
  int nc;    // top-k rows with k <= TOPK_CAP: candidates exported (-1: more than SLOTS)
  float pad;
};

// A logit a top-k row's chunk exports: every entry at least the chunk's own k-th largest.
struct Cand {
  float x;
  int i;
};

__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xff800000u); }

__device__ __forceinline__ u32 mix32(u32 x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ float gumbel(u32 h, u32 i) {
  const u32 r = mix32(mix32(h ^ i) + 0x632BE5ABu);
  const float u = __fmul_rn(__fadd_rn(__uint2float_rn(r >> 9), 0.5f), 1.1920928955078125e-07f);  // * 2^-23, in (0, 1)
  return -logf(-logf(u));
}

// order-preserving float <-> uint32 (ascending)
__device__ __forceinline__ u32 f2key(float f) {
  const u32 u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key2f(u32 k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// online (max, sum exp(x - max)) merge of two partial states
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
  if (m2 == neg_inf()) return;
  if (m == neg_inf()) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 > m) {
    s = s * expf(m - m2) + s2;
    m = m2;
  } else {
    s = s + s2 * expf(m2 - m);
  }
}
// argmax combine: higher value wins, lowest index on ties; i < 0 means "no element"
__device__ __forceinline__ void am_combine(float& v, int& i, float v2, int i2) {
  if (i2 < 0) return;
  if (i < 0 || v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

struct Scratch {
  float f0[NWARP], f1[NWARP];
  int i0[NWARP];
  u64 w64[NWARP];
  int bin;
  u64 rem;
  int ncand;  // sample: a candidate row's gathered candidates (-1: read the whole row)
  float z1;   // sample: a top-p row's normaliser folded from the chunks
};

// Block reductions over NW warps (the whole CTA): every thread returns the result.
template <int NW = NWARP>
__device__ __forceinline__ void block_ms(float& m, float& s, Scratch& sc) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_combine(m, s, m2, s2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sc.f0[warp] = m;
    sc.f1[warp] = s;
  }
  __syncthreads();
  m = lane < NW ? sc.f0[lane] : neg_inf();
  s = lane < NW ? sc.f1[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_combine(m, s, m2, s2);
  }
  __syncthreads();
}
template <int NW = NWARP>
__device__ __forceinline__ void block_argmax(float& v, int& i, Scratch& sc) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
    am_combine(v, i, v2, i2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sc.f0[warp] = v;
    sc.i0[warp] = i;
  }
  __syncthreads();
  v = lane < NW ? sc.f0[lane] : neg_inf();
  i = lane < NW ? sc.i0[lane] : -1;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
    am_combine(v, i, v2, i2);
  }
  __syncthreads();
}
template <int NW = NWARP>
__device__ __forceinline__ float block_sum(float v, Scratch& sc) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sc.f0[warp] = v;
  __syncthreads();
  v = lane < NW ? sc.f0[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

// Exclusive prefix sum over the NW warps' threads (in thread order) of a u64 value; also returns the total.
template <int NW = NWARP>
__device__ __forceinline__ u64 block_excl_scan(u64 v, u64& total, Scratch& sc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  u64 x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) sc.w64[warp] = x;
  __syncthreads();
  if (warp == 0) {
    u64 w = lane < NW ? sc.w64[lane] : 0ull;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const u64 y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    sc.w64[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const u64 before = (warp > 0 ? sc.w64[warp - 1] : 0ull) + x - v;
  total = sc.w64[NW - 1];
  __syncthreads();
  return before;
}

// Given per-bin weights hist[0..nb) (nb = 1024 or 2048) and a remaining target rem >= 1, find the
// highest bin d with  above(d) < rem <= above(d) + hist[d]  (above(d) = sum of bins > d).
// Result in sc.bin (-1 if the bins hold less than rem) and sc.rem = rem - above(d).
template <typename T, int NT = THREADS>
__device__ __forceinline__ void radix_pick(const T* hist, int nb, u64 rem, Scratch& sc) {
  const int per = nb / NT;  // bins per thread (1 or 2 at 1024 threads), highest bins on the lowest threads
  const int top = nb - 1 - threadIdx.x * per;
  u64 v = 0;
  for (int j = 0; j < per; ++j) v += (u64)hist[top - j];
  if (threadIdx.x == 0) sc.bin = -1;
  u64 total;
  const u64 above = block_excl_scan<NT / 32>(v, total, sc);
  if (above < rem && rem <= above + v) {
    u64 cum = above;
    for (int j = 0; j < per; ++j) {
      const u64 h = (u64)hist[top - j];
      if (rem <= cum + h) {
        sc.bin = top - j;
        sc.rem = rem - cum;
        break;
      }
      cum += h;
    }
  }
  __syncthreads();
}

// The three-digit radix search both filters use (11/11/10-bit digits, highest bins first): for each
// digit, zero the histogram, let feed(prefix, pmask, shift, nb) add the weights of the entries whose
// key matches the digits found so far, and pick the bin where the remaining target falls
// (radix_pick). Returns false if the bins ever hold less than the target (then prefix is partial);
// else prefix is the key the target lands on.
template <typename T, int NT, typename Feed>
__device__ __forceinline__ bool radix_search(T* hist, u64 rem, u32& prefix, Scratch& sc, Feed&& feed) {
  u32 pmask = 0u;
  prefix = 0u;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int nb = pass == 2 ? 1024 : 2048;
    for (int i = threadIdx.x; i < nb; i += NT) hist[i] = T(0);
    __syncthreads();
    feed(prefix, pmask, shift, nb);
    __syncthreads();
    radix_pick<T, NT>(hist, nb, rem, sc);
    if (sc.bin < 0) return false;  // uniform over the CTA
    rem = sc.rem;
    prefix |= (u32)sc.bin << shift;
    pmask |= (u32)(nb - 1) << shift;
  }
  return true;
}

// Visit every element of a row: f(i, x, valid) is called by every thread the same number of times
// (invalid calls carry valid = false), so f may use full-warp intrinsics. vec: 16-byte aligned
// row and V % 4 == 0 (float4 loads); else coalesced scalar loads. 16 elements in flight per thread.
template <typename F>
__device__ __forceinline__ void sweep(const float* __restrict__ row, int V, bool vec, F&& f) {
  const int tid = threadIdx.x;
  if (vec) {
    const int V4 = V >> 2;
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int base = 0; base < V4; base += 4 * THREADS) {
      float4 x[4];
      bool ok[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = base + k * THREADS + tid;
        ok[k] = i < V4;
        x[k] = ok[k] ? __ldg(r4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = 4 * (base + k * THREADS + tid);
        f(i, x[k].x, ok[k]);
        f(i + 1, x[k].y, ok[k]);
        f(i + 2, x[k].z, ok[k]);
        f(i + 3, x[k].w, ok[k]);
      }
    }
  } else {
    for (int base = 0; base < V; base += 16 * THREADS) {
      float x[16];
      bool ok[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int i = base + k * THREADS + tid;
        ok[k] = i < V;
        x[k] = ok[k] ? __ldg(row + i) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) f(base + k * THREADS + tid, x[k], ok[k]);
    }
  }
}

// A row is "plain" when it samples (T > 0) with neither filter: its token and logprob follow from
// the partials alone.
__device__ __forceinline__ bool plain_row(float T, int k, float p, int V) {
  return T > 0.f && !(k > 0 && k < V) && !(p < 1.f);
}

// A row is a "candidate" row when it samples with a small top-k (0 < k <= TOPK_CAP, k < V): every
// entry of its top k is among the entries that reach their own chunk's k-th largest value (fewer
// than k entries of the row, hence of the chunk, lie above it), so each chunk exports those and the
// filters run over the exported candidates instead of the whole row.
__device__ __forceinline__ bool cand_row(float T, int k, int V) { return T > 0.f && k > 0 && k < V && k <= TOPK_CAP; }

// A top-p row without a top-k (p < 1) exports, per chunk, the entries whose probability *within the
// chunk* reaches (1 - p) / (2V) (less 1% for roundings): an entry's probability in the row is at most
// its probability in its chunk (the row's normaliser holds the chunk's), and an entry below
// (1 - p) / (2V) can never survive top-p (see top-p above). On a trained model's peaked logits that
// is a few entries a chunk; on flat logits the chunks overflow and the row takes the whole-row passes.
__device__ __forceinline__ bool ptop_row(float T, int k, float p, int V) { return T > 0.f && !(k > 0 && k < V) && p < 1.f; }

__device__ __forceinline__ float top_p_eps(float p, int V) { return __fdiv_rn(1.f - p, 2.f * (float)V); }

__device__ __forceinline__ u32 row_key(u32 lo, u32 hi, int pos) {
  return mix32(mix32(mix32(lo ^ 0x9E3779B9u) ^ hi) ^ (u32)pos);
}

}  // namespace

// One chunk of one row: grid (C, B), PART_THREADS threads; each thread holds 16 logits in registers
// (entries past V read as -inf: they lose every comparison to a real entry, whose index is lower).
extern "C" __global__ void __launch_bounds__(PART_THREADS) sample_partial(
    const float* __restrict__ logits, int ld, int V, const float* __restrict__ temperature,
    const int* __restrict__ top_k, const float* __restrict__ top_p, const u32* __restrict__ seed_lo,
    const u32* __restrict__ seed_hi, const int* __restrict__ pos, const int* __restrict__ mode,
    Partial* __restrict__ part, Cand* __restrict__ cand) {
  pdl_entry();
  constexpr int NW = PART_THREADS / 32;
  __shared__ Scratch sc;
  __shared__ u32 s_hist[2048];
  __shared__ u32 s_key[CHUNK];  // candidate rows: the chunk's keys, out of the registers
  const int c = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const float* row = logits + (long long)b * ld;
  const int base = c * CHUNK;
  const bool vec = (V & 3) == 0 && (reinterpret_cast<unsigned long long>(row) & 15ull) == 0;
  // the index of a thread's j-th logit: float4 number j/4 * PART_THREADS + tid of the chunk, or
  // (scalar loads) entry j * PART_THREADS + tid; ascending in j either way
  auto index = [&](int j) {
    return vec ? base + 4 * ((j >> 2) * PART_THREADS + tid) + (j & 3) : base + j * PART_THREADS + tid;
  };

  float x[PER_THREAD];
  if (vec) {
#pragma unroll
    for (int k = 0; k < PER_THREAD / 4; ++k) {
      const int i = index(4 * k);
      const float4 f = i < V ? __ldg(reinterpret_cast<const float4*>(row + i))  // V % 4 == 0: all four or none
                             : make_float4(neg_inf(), neg_inf(), neg_inf(), neg_inf());
      x[4 * k] = f.x;
      x[4 * k + 1] = f.y;
      x[4 * k + 2] = f.z;
      x[4 * k + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) x[j] = index(j) < V ? __ldg(row + index(j)) : neg_inf();
  }

  // the chunk's max (lowest index on ties) and sum exp(x - max)
  float m = x[0];
  int bi = index(0);
#pragma unroll
  for (int j = 1; j < PER_THREAD; ++j)
    if (x[j] > m) {
      m = x[j];
      bi = index(j);
    }
  block_argmax<NW>(m, bi, sc);
  float s = 0.f;
  if (m != neg_inf()) {
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) s += expf(x[j] - m);
  }
  s = block_sum<NW>(s, sc);

  // plain rows: the chunk's Gumbel-max candidate, and sum exp(l - m / T) for a processed logprob
  const float T = temperature[b];
  float z = 0.f, g = neg_inf();
  int gi = -1;
  if (plain_row(T, top_k[b], top_p[b], V)) {  // uniform over the CTA
    const bool proc = mode[b] == 1;
    const float M = __fdiv_rn(m, T);
    // An entry with l < M - 20 cannot win: l + g <= l + 16.64 (u <= 1 - 2^-24) while the chunk's max
    // entry reaches M + g >= M - 2.82 (u >= 2^-24); 0.54 to spare covers the roundings while |M| < 2^16.
    // Its noise is not drawn (two logf and the hash saved).
    const float cut = fabsf(M) < 65536.f ? __fsub_rn(M, 20.f) : neg_inf();
    const u32 h = row_key(seed_lo[b], seed_hi[b], pos[b]);
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
      if (x[j] == neg_inf()) continue;  // l + g = -inf: never better than a real entry
      const float l = T == 1.f ? x[j] : __fdiv_rn(x[j], T);  // x / 1 is x: RL's usual T skips the division
      if (proc && M != neg_inf()) z += expf(l - M);
      if (l < cut) continue;
      const float val = __fadd_rn(l, gumbel(h, (u32)index(j)));
      if (gi < 0 || val > g) {  // indices ascend within a thread: the first of equal values stays
        g = val;
        gi = index(j);
      }
    }
    block_argmax<NW>(g, gi, sc);
    if (proc) z = block_sum<NW>(z, sc);
  }

  // candidate rows: export the entries that reach the chunk's k-th largest logit (ties included), or
  // (top-p rows without top-k) whose probability within the chunk reaches the top-p floor
  int nc = 0;
  const int k = top_k[b];
  const float p = top_p[b];
  const bool by_k = cand_row(T, k, V), by_p = ptop_row(T, k, p, V);
  if (by_k || by_p) {  // uniform over the CTA
    // thread tid's j-th key at s_key[j * PART_THREADS + tid] (only tid reads it back); entries past V: NONE
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) s_key[j * PART_THREADS + tid] = index(j) < V ? f2key(x[j]) : NONE;
    const float M = __fdiv_rn(m, T);  // the chunk's largest l
    if (by_p) {                       // the partial's z: sum exp(l - M) over the chunk (the fold's Z1)
      float zz = 0.f;
      if (M != neg_inf()) {
#pragma unroll 4
        for (int j = 0; j < PER_THREAD; ++j) {
          const u32 key = s_key[j * PART_THREADS + tid];
          if (key != NONE) zz += expf(__fdiv_rn(key2f(key), T) - M);
        }
      }
      z = block_sum<NW>(zz, sc);
    }
    const float lo = by_p ? 0.99f * top_p_eps(p, V) : 0.f;
    u32 kth = 0u;           // every key is >= 0: a chunk of at most k entries exports them all
    auto keep = [&](u32 key) {
      if (key == NONE) return false;
      if (by_k) return key >= kth;
      return M != neg_inf() && __fdiv_rn(expf(__fdiv_rn(key2f(key), T) - M), z) >= lo;
    };
    if (by_k && V - base > k) {  // k-th largest key of the chunk (always found: 1 <= k <= its entries)
      radix_search<u32, PART_THREADS>(s_hist, (u64)k, kth, sc, [&](u32 prefix, u32 pmask, int shift, int nb) {
#pragma unroll 4
        for (int j = 0; j < PER_THREAD; ++j) {
          const u32 key = s_key[j * PART_THREADS + tid];
          if (key != NONE && (key & pmask) == prefix) atomicAdd(&s_hist[(key >> shift) & (u32)(nb - 1)], 1u);
        }
      });
    }
    int mine = 0;
#pragma unroll 4
    for (int j = 0; j < PER_THREAD; ++j) mine += keep(s_key[j * PART_THREADS + tid]);
    u64 total;
    int at = (int)block_excl_scan<NW>((u64)mine, total, sc);
    nc = total <= (u64)SLOTS ? (int)total : -1;
    if (nc > 0) {  // in thread order, then in index order within a thread: a fixed order
      Cand* dst = cand + ((long long)b * gridDim.x + c) * SLOTS;
#pragma unroll 4
      for (int j = 0; j < PER_THREAD; ++j) {
        const u32 key = s_key[j * PART_THREADS + tid];
        if (keep(key)) dst[at++] = Cand{key2f(key), index(j)};
      }
    }
  }
  if (tid == 0) {
    Partial out;
    out.m = m;
    out.s = s;
    out.bi = bi;
    out.z = z;
    out.g = g;
    out.gi = gi;
    out.nc = nc;
    out.pad = 0.f;
    part[(long long)b * gridDim.x + c] = out;
  }
}

// One row per CTA: fold the row's C partials, then finish (greedy, plain) or filter (top-k, top-p).
extern "C" __global__ void __launch_bounds__(1024) sample(const float* __restrict__ logits, int ld, int V,
                                                          const float* __restrict__ temperature,
                                                          const int* __restrict__ top_k, const float* __restrict__ top_p,
                                                          const u32* __restrict__ seed_lo,
                                                          const u32* __restrict__ seed_hi, const int* __restrict__ pos,
                                                          const int* __restrict__ mode,
                                                          const Partial* __restrict__ part,
                                                          const Cand* __restrict__ cand, int C,
                                                          int* __restrict__ tokens, float* __restrict__ logprobs) {
  pdl_entry();
  __shared__ u64 s_hist[2048];  // bin counts (as u32) or fixed-point masses (u64)
  __shared__ Scratch sc;
  __shared__ float s_cx[NCAND];  // a candidate row's gathered candidates
  __shared__ int s_ci[NCAND];
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const float* row = logits + (long long)b * ld;

  const bool vec = (V & 3) == 0 && (reinterpret_cast<unsigned long long>(row) & 15ull) == 0;
  const float Tf = temperature[b];
  const int k = top_k[b];
  const float p = top_p[b];
  const bool plain = plain_row(Tf, k, p, V);
  const bool by_p = ptop_row(Tf, k, p, V);
  const bool proc = mode[b] == 1;

  // Fold the partials: raw max / log-sum-exp and argmax (lowest index on ties); for plain rows the
  // Gumbel-max token and the normaliser of l. Thread t folds chunks t, t + 1024, ... in order.
  float m = neg_inf(), s = 0.f, bv = neg_inf(), Mz = neg_inf(), z = 0.f, best = neg_inf();
  int bi = -1, tok = -1;
  for (int c = tid; c < C; c += THREADS) {
    const Partial P = part[(long long)b * C + c];
    ms_combine(m, s, P.m, P.s);
    am_combine(bv, bi, P.m, P.bi);
    if (plain) am_combine(best, tok, P.g, P.gi);
    if (plain && proc) ms_combine(Mz, z, __fdiv_rn(P.m, Tf), P.z);
  }
  block_ms(m, s, sc);
  block_argmax(bv, bi, sc);
  const float log_s = logf(s);
  // A top-p row's normaliser Z1 (relative to M), folded from the chunks into shared memory. Its own
  // loop: folding it in the loop above (into Mz, z) made ptxas spill at the 64 registers of a
  // 1024-thread CTA.
  if (by_p) {
    float Mp = neg_inf(), zp = 0.f;
    for (int c = tid; c < C; c += THREADS) {
      const Partial P = part[(long long)b * C + c];
      ms_combine(Mp, zp, __fdiv_rn(P.m, Tf), P.z);
    }
    block_ms(Mp, zp, sc);
    if (tid == 0) sc.z1 = zp;
  }

  if (!(Tf > 0.f)) {  // greedy
    if (tid == 0) {
      tokens[b] = bi;
      logprobs[b] = __fsub_rn(__fsub_rn(row[bi], m), log_s);
    }
    return;
  }
  if (plain) {
    block_argmax(best, tok, sc);
    if (proc) block_ms(Mz, z, sc);
    if (tid == 0) {
      if (tok < 0) tok = bi;  // unreachable for finite logits
      tokens[b] = tok;
      if (proc)
        logprobs[b] = __fsub_rn(__fsub_rn(__fdiv_rn(row[tok], Tf), Mz), logf(z));
      else
        logprobs[b] = __fsub_rn(__fsub_rn(row[tok], m), log_s);
    }
    return;
  }
  const float M = __fdiv_rn(bv, Tf);  // max of l (division by T > 0 is monotone)

  // A candidate row gathers its chunks' candidates (chunk by chunk in thread order: a fixed order)
  // and runs the passes below over them; if a chunk had too many to export, or the row too many to
  // hold, the passes read the whole row.
  if (tid == 0) sc.ncand = -1;
  if (cand_row(Tf, k, V) || by_p) {  // uniform over the CTA
    u64 mine = 0;
    int bad = 0;
    for (int c = tid; c < C; c += THREADS) {
      const int nc = part[(long long)b * C + c].nc;
      bad |= nc < 0;
      mine += nc < 0 ? 0 : nc;
    }
    if (!__syncthreads_or(bad)) {
      u64 total;
      u64 at = block_excl_scan(mine, total, sc);
      if (total <= (u64)NCAND) {
        for (int c = tid; c < C; c += THREADS) {
          const long long chunk = (long long)b * C + c;
          const int nc = part[chunk].nc;
          for (int e = 0; e < nc; ++e, ++at) {
            const Cand cd = cand[chunk * SLOTS + e];
            s_cx[at] = cd.x;
            s_ci[at] = cd.i;
          }
        }
        if (tid == 0) sc.ncand = (int)total;
      }
    }
  }
  __syncthreads();
  // Visit every candidate (or every entry of the row): f(i, x, valid) with uniform trip counts.
  auto visit = [&](auto&& f) {
    const int N = *(volatile int*)&sc.ncand;  // read here: no register held across the passes
    if (N >= 0) {
      for (int base = 0; base < N; base += THREADS) {
        const int j = base + tid;
        const bool ok = j < N;
        f(ok ? s_ci[j] : 0, ok ? s_cx[j] : 0.f, ok);
      }
    } else {
      sweep(row, V, vec, f);
    }
  };

  // top-k threshold: kth = (k-th largest logit, counting ties) / T, by radix select on ordered keys.
  float kth = neg_inf();
  if (k > 0 && k < V) {  // always found: 1 <= k <= the row's entries
    u32* hist = reinterpret_cast<u32*>(s_hist);
    u32 prefix;
    radix_search<u32, THREADS>(hist, (u64)k, prefix, sc, [&](u32 pre, u32 pmask, int shift, int nb) {
      visit([&](int, float x, bool ok) {
        u32 bin = NONE;
        if (ok) {
          const u32 key = f2key(x);
          if ((key & pmask) == pre) bin = (key >> shift) & (u32)(nb - 1);
        }
        const u32 peers = __match_any_sync(0xffffffffu, bin);  // every lane calls: uniform sweep
        if (bin != NONE && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (u32)__popc(peers));
      });
    });
    kth = __fdiv_rn(key2f(prefix), Tf);
  }

  // top-p threshold tau over q = softmax(l) restricted to the top-k survivors.
  const bool use_p = p < 1.f;
  float Z1 = 1.f, tau = 0.f;
  if (use_p) {
    if (ptop_row(Tf, k, p, V) && *(volatile int*)&sc.ncand >= 0) {
      Z1 = *(volatile float*)&sc.z1;  // the candidates are not the whole row: the chunks' normaliser
    } else {
      float zs = 0.f;
      visit([&](int, float x, bool ok) {
        const float l = __fdiv_rn(x, Tf);
        if (ok && l >= kth) zs += expf(l - M);
      });
      Z1 = block_sum(zs, sc);
    }
    const float eps = top_p_eps(p, V);
    const double tgt = ceil((double)p * 4503599627370496.0);  // p in 2^-52 fixed point
    u32 prefix;
    // not found: the total mass (rounded) is below p -> keep every survivor
    const bool found = radix_search<u64, THREADS>(s_hist, tgt < 1.0 ? 1ull : (u64)tgt, prefix, sc,
                                                  [&](u32 pre, u32 pmask, int shift, int nb) {
      visit([&](int, float x, bool ok) {
        const float l = __fdiv_rn(x, Tf);
        if (ok && l >= kth) {
          const float qv = __fdiv_rn(expf(l - M), Z1);
          const u32 key = __float_as_uint(qv);
          if (qv >= eps && (key & pmask) == pre) {
            const u64 mq = __float2ull_rn(qv * 4503599627370496.0f);
            if (mq) atomicAdd(&s_hist[(key >> shift) & (u32)(nb - 1)], mq);
          }
        }
      });
    });
    tau = found ? __uint_as_float(prefix) : 0.f;
    if (!found && ptop_row(Tf, k, p, V)) {  // every entry survives: the final pass reads the whole row
      __syncthreads();
      if (tid == 0) sc.ncand = -1;
      __syncthreads();
    }
  }

  // Final pass: Gumbel-max over the survivors (lowest index on ties), and their normaliser for the
  // processed logprob.
  const u32 h = row_key(seed_lo[b], seed_hi[b], pos[b]);
  float z2 = 0.f;
  best = neg_inf();
  tok = -1;
  visit([&](int i, float x, bool ok) {
    const float l = __fdiv_rn(x, Tf);
    if (ok && l >= kth) {
      const float e = expf(l - M);
      if (!use_p || __fdiv_rn(e, Z1) >= tau) {
        z2 += e;
        const float val = __fadd_rn(l, gumbel(h, (u32)i));
        if (tok < 0 || val > best || (val == best && i < tok)) {
          best = val;
          tok = i;
        }
      }
    }
  });
  block_argmax(best, tok, sc);
  const float Z2 = block_sum(z2, sc);
  if (tid == 0) {
    if (tok < 0) tok = bi;  // unreachable for finite logits: the maximum always survives
    tokens[b] = tok;
    if (mode[b] == 1)
      logprobs[b] = __fsub_rn(__fsub_rn(__fdiv_rn(row[tok], Tf), M), logf(Z2));
    else
      logprobs[b] = __fsub_rn(__fsub_rn(row[tok], m), log_s);
  }
}
