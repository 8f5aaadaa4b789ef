"""Sampling: the counter-based hash, uniforms, the top-k/top-p filters, Gumbel-max sampling, logprobs modes."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from reference import SamplingParams
from reference import sampling as S

from _helpers import examples, drive, rand_ids, tiny_engine

M32 = 0xFFFFFFFF
U32 = st.integers(0, M32)
QWEN3_VOCAB = 151936


# ----------------------------------------------------------------------------- the hash, in pure Python

def py_mix(x: int) -> int:
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def py_key(seed: int, pos: int) -> int:
    h = py_mix((seed & M32) ^ 0x9E3779B9)
    h = py_mix(h ^ ((seed >> 32) & M32))
    return py_mix(h ^ (pos & M32))


def py_uniform(seed: int, pos: int, i: int) -> float:
    r = py_mix((py_mix(py_key(seed, pos) ^ i) + 0x632BE5AB) & M32)
    return float(np.float32(((r >> 9) + 0.5) / 2**23))   # exact in float32 (23 bits and a half)


@settings(max_examples=examples(200))
@given(xs=st.lists(U32, min_size=1, max_size=64))
def test_mix32_equals_pure_python(xs):
    got = S.mix32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [py_mix(x) for x in xs]


def test_mix32_edges():
    xs = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, M32, 0x9E3779B9]
    assert S.mix32(torch.tensor(xs)).tolist() == [py_mix(x) for x in xs]
    assert py_mix(0) == 0 and len({py_mix(x) for x in range(1, 5000)}) == 4999   # a bijection on uint32


@settings(max_examples=examples(60))
@given(seed=st.integers(0, 2**64 - 1), pos=st.integers(0, 2**33), V=st.integers(1, 300))
def test_uniforms_equal_pure_python_and_in_open_interval(seed, pos, V):
    assert S.sequence_key(seed, pos) == py_key(seed, pos)
    u = S.uniforms(seed, pos, V)
    assert u.dtype == torch.float32 and u.shape == (V,)
    assert u.tolist() == [py_uniform(seed, pos, i) for i in range(V)]
    assert bool((u > 0).all()) and bool((u < 1).all())


@settings(max_examples=examples(30))
@given(seed=st.integers(0, 2**64 - 1), pos=st.integers(0, 10**6), V=st.integers(2, 2000), W=st.integers(1, 2000))
def test_uniforms_counter_based(seed, pos, V, W):
    a = S.uniforms(seed, pos, V)
    assert torch.equal(a, S.uniforms(seed, pos, V)), "same (seed, pos) must give the same draw"
    n = min(V, W)
    assert torch.equal(a[:n], S.uniforms(seed, pos, W)[:n]), "u_i must not depend on the vocabulary size"
    if V >= 16:
        assert not torch.equal(a, S.uniforms(seed, pos + 1, V)), "positions must get different draws"
        assert not torch.equal(a, S.uniforms(seed ^ 1, pos, V)), "seeds must get different draws"
        assert not torch.equal(a, S.uniforms(seed ^ (1 << 40), pos, V)), "the seed's high word must matter"


def test_uniforms_never_reach_one_at_qwen3_vocab():
    """u must lie in (0, 1) for every entry of a real Qwen3 vocabulary: u == 1 gives Gumbel noise +inf,
    which forces that token whatever its logit (and NaN for a filtered one)."""
    bad = []
    for seed in (0, 1):
        for pos in range(256):
            u = S.uniforms(seed, pos, QWEN3_VOCAB)
            if not bool((u < 1).all()):
                bad.append((seed, pos, torch.nonzero(u >= 1).flatten().tolist()))
    assert not bad, f"u == 1.0 at (seed, pos, ids) {bad[:4]} ({len(bad)} draws of 512)"


def test_top_k_1_is_greedy_at_qwen3_vocab():
    """top_k=1 leaves one survivor: sampling must return it at every position."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(QWEN3_VOCAB, generator=g)
    best = int(logits.argmax())
    sp = SamplingParams(temperature=1.0, top_k=1, seed=0, stop_token_ids=())
    wrong = [(pos, tok) for pos in range(200) for tok, _ in [S.sample_one(logits, sp, pos)] if tok != best]
    assert not wrong, f"top_k=1 sampled a filtered token at (pos, token) {wrong[:5]}"


def test_dominant_token_always_sampled_at_qwen3_vocab():
    """One logit 40 above the rest of a Qwen3-size vocabulary: all other tokens together have probability
    ~151935 * e^-40 (about 6e-13) per draw, so 400 draws at temperature 1 (no filters) must all pick it.
    A uniform that rounds to exactly 1.0 (Gumbel noise +inf) makes its entry win whatever its logit."""
    logits = torch.zeros(QWEN3_VOCAB)
    logits[777] = 40.0
    sp = SamplingParams(temperature=1.0, seed=0, stop_token_ids=())
    wrong = [(pos, tok) for pos in range(400) for tok, _ in [S.sample_one(logits, sp, pos)] if tok != 777]
    assert not wrong, f"sampled near-impossible tokens at (pos, token) {wrong[:5]} ({len(wrong)}/400 draws)"


def test_gumbel_finite_small_vocab():
    for pos in range(50):
        g = S.gumbel(3, pos, 1000)
        assert torch.isfinite(g).all()


# ----------------------------------------------------------------------------- filters vs a sort-based oracle

def oracle_survivors(logits: list[float], T: float, k: int, p: float) -> tuple[set[int], float]:
    """Survivor ids of top-k then top-p, by sorting (float64), and the distance of the top-p cut to ``p``."""
    l = [float(np.float32(x) / np.float32(T)) for x in logits]
    V = len(l)
    keep = list(range(V))
    if 0 < k < V:
        kth = sorted(l, reverse=True)[k - 1]
        keep = [i for i in keep if l[i] >= kth]
    slack = math.inf
    if p < 1.0:
        m = max(l[i] for i in keep)
        z = sum(math.exp(l[i] - m) for i in keep)
        prob = {i: math.exp(l[i] - m) / z for i in keep}
        order = sorted(keep, key=lambda i: -prob[i])
        mass = 0.0
        tau = prob[order[-1]]
        for i in order:
            before = mass
            mass += prob[i]
            slack = min(slack, abs(mass - p), abs(before - p))
            if mass >= p:
                tau = prob[i]
                break
        keep = [i for i in keep if prob[i] >= tau * (1 - 1e-12)]
        # distinct probabilities near tau would make float32 and float64 disagree
        near = [i for i in range(V) if i not in keep and i in prob and prob[i] > tau * (1 - 1e-5)]
        if near:
            slack = 0.0
    return set(keep), slack


@settings(max_examples=examples(300))
@given(logits=st.lists(st.integers(-24, 24), min_size=1, max_size=40),
       T=st.sampled_from([0.3, 0.8, 1.0, 2.5]), k=st.integers(0, 45),
       p=st.sampled_from([1.0, 0.95, 0.9, 0.5, 0.1, 0.01]))
def test_filter_survivors_equal_sort_oracle(logits, T, k, p):
    x = [v / 4 for v in logits]                      # quarter steps: plenty of ties
    want, slack = oracle_survivors(x, T, k, p)
    assume(slack > 1e-5)
    sp = SamplingParams(temperature=T, top_k=k, top_p=p)
    f = S.filtered_logits(torch.tensor(x, dtype=torch.float32), sp)
    got = set(torch.nonzero(torch.isfinite(f)).flatten().tolist())
    assert got == want, f"survivors {sorted(got)} != oracle {sorted(want)} (T={T}, k={k}, p={p})"
    # survivors keep their value logits / T
    for i in got:
        assert f[i].item() == pytest.approx(x[i] / T, rel=1e-6, abs=1e-6)
    # and sampling only ever picks a survivor
    for pos in range(5):
        tok, lp = S.sample_one(torch.tensor(x), sp, pos)
        assert tok in want and lp <= 0.0


def test_greedy_ties_pick_lowest_id_and_processed_equals_raw():
    logits = torch.tensor([0.0, 1.0, 3.0, -1.0, 3.0, 2.0])
    for mode in ("raw", "processed"):
        tok, lp = S.sample_one(logits, SamplingParams(temperature=0.0, logprobs_mode=mode), 7)
        assert tok == 2
        assert lp == pytest.approx(torch.log_softmax(logits, -1)[2].item(), abs=1e-7)


@pytest.mark.parametrize("T,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.3, 0, 0.8)])
def test_sampling_frequencies_follow_the_filtered_softmax(T, k, p):
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -2.0])
    sp = SamplingParams(temperature=T, top_k=k, top_p=p, seed=123)
    target = torch.softmax(S.filtered_logits(logits, sp), -1)
    n = 4000
    counts = torch.zeros(6)
    for pos in range(n):
        counts[S.sample_one(logits, sp, pos)[0]] += 1
    freq = counts / n
    assert (freq[target == 0] == 0).all(), "a filtered token was sampled"
    err = (freq - target).abs().max().item()
    assert err < 0.03, f"empirical {freq.tolist()} vs target {target.tolist()} (max diff {err:.3f})"


# ----------------------------------------------------------------------------- logprobs modes, engine level

def test_logprobs_modes_raw_vs_processed():
    eng = tiny_engine(block_size=4)
    prompt = rand_ids(random.Random(1), 11)
    base = dict(temperature=0.8, top_p=0.9, top_k=50, max_tokens=6, stop_token_ids=(), seed=9)
    sps = {m: SamplingParams(logprobs_mode=m, **base) for m in ("raw", "processed")}
    recs = {m: drive(tiny_engine(block_size=4), [(prompt, sp)], turns=3,
                     obs_fn=lambda i, k, t: [1, 2, 3][:k + 1])[0] for m, sp in sps.items()}
    raw, proc = recs["raw"].trajectory, recs["processed"].trajectory
    assert raw.token_ids == proc.token_ids, "logprobs_mode must not change the sampled tokens"
    lsm_scores = eng.score(raw.token_ids)
    n_diff = 0
    for t, m in enumerate(raw.assistant_mask):
        if not m:
            continue
        logits = lsm_scores[t - 1]
        tok = raw.token_ids[t]
        assert raw.logprobs[t] == pytest.approx(torch.log_softmax(logits, -1)[tok].item(), abs=1e-4)
        keep, _ = oracle_survivors(logits.tolist(), base["temperature"], base["top_k"], base["top_p"])
        assert tok in keep, f"position {t}: sampled token {tok} was filtered out"
        l = logits / base["temperature"]
        masked = torch.full_like(l, -math.inf)
        idx = torch.tensor(sorted(keep))
        masked[idx] = l[idx]
        want = torch.log_softmax(masked, -1)[tok].item()
        assert proc.logprobs[t] == pytest.approx(want, abs=1e-4), f"position {t}: processed logprob"
        assert proc.logprobs[t] <= 0.0
        n_diff += abs(proc.logprobs[t] - raw.logprobs[t]) > 1e-3
    assert n_diff >= 1, "processed and raw logprobs never differ"
    # at temperature 0 processed == raw
    g = {m: tiny_engine().generate([prompt], SamplingParams(max_tokens=4, stop_token_ids=(), logprobs_mode=m))
         for m in ("raw", "processed")}
    assert g["raw"] == g["processed"]
