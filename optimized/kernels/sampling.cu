// sampling.cu -- greedy / temperature + top-k + top-p sampling with counter-based Gumbel noise.
//
// Reference twin: reference/sampling.py, sample_one (one CTA of 1024 threads per row).
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
// All reductions use a fixed tree (no float atomics): a row's result is reproducible run to run
// and independent of the other rows. Passes over the row: 1 (greedy) to 9 (top-k and top-p); each
// pass streams the row with 16-byte loads, 4 in flight per thread, uniform trip counts.
// logits fp32 [B, V] (row stride ld); per-row parameter arrays of length B; outputs int32 / fp32 [B].

#include <cuda_bf16.h>

#include "pdl.cuh"

namespace {

typedef unsigned int u32;
typedef unsigned long long u64;

constexpr int THREADS = 1024;
constexpr int NWARP = THREADS / 32;
constexpr u32 NONE = 0xffffffffu;

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
};

// Block reductions: every thread returns the result.
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
  m = sc.f0[lane];
  s = sc.f1[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_combine(m, s, m2, s2);
  }
  __syncthreads();
}
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
  v = sc.f0[lane];
  i = sc.i0[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
    am_combine(v, i, v2, i2);
  }
  __syncthreads();
}
__device__ __forceinline__ float block_sum(float v, Scratch& sc) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sc.f0[warp] = v;
  __syncthreads();
  v = sc.f0[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

// Exclusive prefix sum over threads (in thread order) of a u64 value; also returns the total.
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
    u64 w = sc.w64[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const u64 y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    sc.w64[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const u64 before = (warp > 0 ? sc.w64[warp - 1] : 0ull) + x - v;
  total = sc.w64[NWARP - 1];
  __syncthreads();
  return before;
}

// Given per-bin weights hist[0..nb) (nb = 1024 or 2048) and a remaining target rem >= 1, find the
// highest bin d with  above(d) < rem <= above(d) + hist[d]  (above(d) = sum of bins > d).
// Result in sc.bin (-1 if the bins hold less than rem) and sc.rem = rem - above(d).
template <typename T>
__device__ __forceinline__ void radix_pick(const T* hist, int nb, u64 rem, Scratch& sc) {
  const int per = nb / THREADS;  // 1 or 2 bins per thread, highest bins on the lowest threads
  const int top = nb - 1 - threadIdx.x * per;
  u64 v = 0;
  for (int j = 0; j < per; ++j) v += (u64)hist[top - j];
  if (threadIdx.x == 0) sc.bin = -1;
  u64 total;
  const u64 above = block_excl_scan(v, total, sc);
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

}  // namespace

extern "C" __global__ void __launch_bounds__(1024) sample(const float* __restrict__ logits, int ld, int V,
                                                          const float* __restrict__ temperature,
                                                          const int* __restrict__ top_k, const float* __restrict__ top_p,
                                                          const u32* __restrict__ seed_lo,
                                                          const u32* __restrict__ seed_hi, const int* __restrict__ pos,
                                                          const int* __restrict__ mode, int* __restrict__ tokens,
                                                          float* __restrict__ logprobs) {
  pdl_entry();
  __shared__ u64 s_hist[2048];  // bin counts (as u32) or fixed-point masses (u64)
  __shared__ Scratch sc;
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const float* row = logits + (long long)b * ld;

  const bool vec = (V & 3) == 0 && (reinterpret_cast<unsigned long long>(row) & 15ull) == 0;

  // Pass 1: raw max / log-sum-exp and argmax (lowest index on ties). Online softmax rescaled once
  // per group of 16 elements (branch-free inner loop).
  float m = neg_inf(), s = 0.f, bv = neg_inf();
  int bi = -1;
  auto push16 = [&](const float (&x)[16], const int (&ix)[16], const bool (&ok)[16]) {
    float mx = neg_inf();
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (!ok[j]) continue;
      mx = fmaxf(mx, x[j]);
      if (bi < 0 || x[j] > bv || (x[j] == bv && ix[j] < bi)) {
        bv = x[j];
        bi = ix[j];
      }
    }
    if (mx > m) {
      s *= expf(m - mx);  // m = -inf: s is 0 and stays 0
      m = mx;
    }
    if (m != neg_inf()) {
#pragma unroll
      for (int j = 0; j < 16; ++j) s += ok[j] ? expf(x[j] - m) : 0.f;
    }
  };
  if (vec) {
    const int V4 = V >> 2;
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int base = 0; base < V4; base += 4 * THREADS) {
      float x[16];
      int ix[16];
      bool ok[16];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = base + k * THREADS + tid;
        const bool v = i < V4;
        const float4 f = v ? __ldg(r4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        x[4 * k] = f.x;
        x[4 * k + 1] = f.y;
        x[4 * k + 2] = f.z;
        x[4 * k + 3] = f.w;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          ix[4 * k + c] = 4 * i + c;
          ok[4 * k + c] = v;
        }
      }
      push16(x, ix, ok);
    }
  } else {
    for (int base = 0; base < V; base += 16 * THREADS) {
      float x[16];
      int ix[16];
      bool ok[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        ix[k] = base + k * THREADS + tid;
        ok[k] = ix[k] < V;
        x[k] = ok[k] ? __ldg(row + ix[k]) : 0.f;
      }
      push16(x, ix, ok);
    }
  }
  block_ms(m, s, sc);
  block_argmax(bv, bi, sc);
  const float log_s = logf(s);

  const float Tf = temperature[b];
  if (!(Tf > 0.f)) {  // greedy
    if (tid == 0) {
      tokens[b] = bi;
      logprobs[b] = __fsub_rn(__fsub_rn(row[bi], m), log_s);
    }
    return;
  }
  const float M = __fdiv_rn(bv, Tf);  // max of l (division by T > 0 is monotone)

  // top-k threshold: kth = (k-th largest logit, counting ties) / T, by radix select on ordered keys.
  const int k = top_k[b];
  float kth = neg_inf();
  if (k > 0 && k < V) {
    u32* hist = reinterpret_cast<u32*>(s_hist);
    u32 prefix = 0u, pmask = 0u;
    u64 rem = (u64)k;
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
      const int nb = pass == 2 ? 1024 : 2048;
      for (int i = tid; i < nb; i += THREADS) hist[i] = 0u;
      __syncthreads();
      sweep(row, V, vec, [&](int, float x, bool ok) {
        u32 bin = NONE;
        if (ok) {
          const u32 key = f2key(x);
          if ((key & pmask) == prefix) bin = (key >> shift) & (u32)(nb - 1);
        }
        const u32 peers = __match_any_sync(0xffffffffu, bin);  // every lane calls: uniform sweep
        if (bin != NONE && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (u32)__popc(peers));
      });
      __syncthreads();
      radix_pick<u32>(hist, nb, rem, sc);
      const int d = sc.bin;  // always found: 1 <= rem <= count of the prefix class
      rem = sc.rem;
      prefix |= (u32)d << shift;
      pmask |= (u32)(nb - 1) << shift;
    }
    kth = __fdiv_rn(key2f(prefix), Tf);
  }

  // top-p threshold tau over q = softmax(l) restricted to the top-k survivors.
  const float p = top_p[b];
  const bool use_p = p < 1.f;
  float Z1 = 1.f, tau = 0.f;
  if (use_p) {
    float z = 0.f;
    sweep(row, V, vec, [&](int, float x, bool ok) {
      const float l = __fdiv_rn(x, Tf);
      if (ok && l >= kth) z += expf(l - M);
    });
    Z1 = block_sum(z, sc);
    const float eps = __fdiv_rn(1.f - p, 2.f * (float)V);
    const double tgt = ceil((double)p * 4503599627370496.0);  // p in 2^-52 fixed point
    u64 rem = tgt < 1.0 ? 1ull : (u64)tgt;
    u32 prefix = 0u, pmask = 0u;
    bool found = true;
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
      const int nb = pass == 2 ? 1024 : 2048;
      for (int i = tid; i < nb; i += THREADS) s_hist[i] = 0ull;
      __syncthreads();
      sweep(row, V, vec, [&](int, float x, bool ok) {
        const float l = __fdiv_rn(x, Tf);
        if (ok && l >= kth) {
          const float qv = __fdiv_rn(expf(l - M), Z1);
          const u32 key = __float_as_uint(qv);
          if (qv >= eps && (key & pmask) == prefix) {
            const u64 mq = __float2ull_rn(qv * 4503599627370496.0f);
            if (mq) atomicAdd(&s_hist[(key >> shift) & (u32)(nb - 1)], mq);
          }
        }
      });
      __syncthreads();
      radix_pick<u64>(s_hist, nb, rem, sc);
      const int d = sc.bin;
      if (d < 0) {  // uniform: total mass (rounded) below p -> keep every survivor
        found = false;
        break;
      }
      rem = sc.rem;
      prefix |= (u32)d << shift;
      pmask |= (u32)(nb - 1) << shift;
    }
    tau = found ? __uint_as_float(prefix) : 0.f;
  }

  // Final pass: Gumbel-max over the survivors (lowest index on ties), and their normaliser for the
  // processed logprob.
  const u32 h = mix32(mix32(mix32(seed_lo[b] ^ 0x9E3779B9u) ^ seed_hi[b]) ^ (u32)pos[b]);
  float best = neg_inf(), z2 = 0.f;
  int tok = -1;
  sweep(row, V, vec, [&](int i, float x, bool ok) {
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
