"""Kernel math (DESIGN §3): split-KV decode, paged prefill, partial-state merge, launch guards."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from reference import BlockTableError, MergeError, PartialState
from reference import attention as A
from reference.kernels import ReferenceKernels

from _helpers import examples, BF16_EPS, cdiv, dense_attention_one, lse_one, make_paged

K = ReferenceKernels()
N_Q, N_KV, D = 4, 2, 8
TOL = 1e-5


def _q(B, seed=0, dtype=torch.float32):
    return torch.randn(B, N_Q, D, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _setup(lens, bs=4, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    return make_paged(g, lens, bs, N_KV, D, **kw)


def _expected(q, dk, dv, lens):
    return torch.stack([dense_attention_one(q[b], dk[b][:lens[b]], dv[b][:lens[b]]) for b in range(len(lens))])


# ----------------------------------------------------------------------------- split-KV decode

LENS = [0, 1, 3, 4, 5, 13, 16, 31]


@pytest.mark.parametrize("bs", [1, 4, 8])
def test_split_kv_decode_every_split_size(bs):
    kc, vc, tables, lens, dk, dv = _setup(LENS, bs=bs)
    q = _q(len(LENS))
    want = _expected(q, dk, dv, LENS)
    unsplit = K.split_kv_decode(q, kc, vc, tables, lens, None)
    assert torch.isfinite(unsplit).all()
    assert (unsplit.double() - want).abs().max() <= TOL
    for S in list(range(1, max(LENS) + 6)) + [1000]:
        out = K.split_kv_decode(q, kc, vc, tables, lens, S)
        assert out.dtype == q.dtype and out.shape == q.shape
        assert torch.isfinite(out).all(), f"split size {S}, block {bs}: NaN/inf in the output"
        err = (out.double() - want).abs().max().item()
        assert err <= TOL, f"split size {S}, block {bs}: differs from dense attention by {err:.2e}"
        assert (out - unsplit).abs().max().item() <= TOL, f"split size {S}: differs from unsplit"
        assert torch.equal(out[0], torch.zeros(N_Q, D)), "a zero-length sequence must attend to nothing (zeros)"


def test_split_kv_more_splits_than_blocks_and_padding_splits():
    """Split size 1 on 4-token blocks (4 splits a block) and extra empty splits via max_splits."""
    kc, vc, tables, lens, dk, dv = _setup([0, 2, 9], bs=4)
    q = _q(3, seed=1)
    want = _expected(q, dk, dv, [0, 2, 9])
    for S, max_splits in ((1, None), (1, 20), (2, 12), (3, 4), (50, 3)):
        o, lse = K.split_kv_partials(q, kc, vc, tables, lens, S, max_splits=max_splits)
        n = max_splits or max(cdiv(9, S), 1)
        assert o.shape == (3, n, N_Q, D) and lse.shape == (3, n, N_Q)
        assert o.dtype == lse.dtype == torch.float32
        assert torch.isfinite(o).all() and not torch.isnan(lse).any()
        for b, L in enumerate([0, 2, 9]):
            for k in range(n):
                lo, hi = k * S, min((k + 1) * S, L)
                if lo >= hi:
                    assert torch.equal(o[b, k], torch.zeros(N_Q, D)), f"empty split ({b},{k}) must write o = 0"
                    assert torch.equal(lse[b, k], torch.full((N_Q,), -math.inf)), f"empty split ({b},{k}) lse != -inf"
                else:
                    assert (o[b, k].double() - dense_attention_one(q[b], dk[b][lo:hi], dv[b][lo:hi])).abs().max() <= TOL
                    assert (lse[b, k].double() - lse_one(q[b], dk[b][lo:hi])).abs().max() <= TOL
        out, tot = A.reduce_splits(o, lse)
        assert torch.isfinite(out).all()
        assert (out.double() - want).abs().max() <= TOL, f"S={S} max_splits={max_splits}: reduce != dense"
        assert torch.equal(tot[0], torch.full((N_Q,), -math.inf))
        for b, L in ((1, 2), (2, 9)):
            assert (tot[b].double() - lse_one(q[b], dk[b][:L])).abs().max() <= TOL


def test_split_kv_all_empty_batch():
    kc, vc, tables, lens, _, _ = _setup([0, 0], bs=4)
    q = _q(2)
    for S in (None, 1, 7):
        out = K.split_kv_decode(q, kc, vc, tables, lens, S)
        assert torch.equal(out, torch.zeros_like(q)), f"split {S}: all-empty batch must give zeros"


def test_split_kv_nan_in_stale_slots_never_reaches_output():
    """Every unwritten slot of a used page and every unused page is NaN, the query is huge: still finite."""
    kc, vc, tables, lens, dk, dv = _setup([5, 7], bs=4, spare_pages=6)
    assert torch.isnan(kc).any() and torch.isnan(vc).any()
    q = _q(2) * 30
    want = _expected(q, dk, dv, [5, 7])
    for S in range(1, 10):
        out = K.split_kv_decode(q, kc, vc, tables, lens, S)
        assert torch.isfinite(out).all()
        assert (out.double() - want).abs().max() <= 1e-4


@settings(max_examples=examples(40))
@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=5), bs=st.sampled_from([1, 2, 4, 16]),
       S=st.integers(1, 50), seed=st.integers(0, 1000))
def test_split_kv_random(lens, bs, S, seed):
    kc, vc, tables, tl, dk, dv = _setup(lens, bs=bs, seed=seed)
    q = _q(len(lens), seed=seed)
    out = K.split_kv_decode(q, kc, vc, tables, tl, S)
    assert torch.isfinite(out).all()
    assert (out.double() - _expected(q, dk, dv, lens)).abs().max() <= TOL


def test_split_kv_bf16_within_rounding_of_unsplit():
    kc, vc, tables, lens, dk, dv = _setup(LENS, bs=4, dtype=torch.bfloat16)
    q = _q(len(LENS), dtype=torch.bfloat16)
    want = _expected(q, dk, dv, LENS)
    unsplit = K.split_kv_decode(q, kc, vc, tables, lens, None)
    e_unsplit = (unsplit.double() - want).abs().max().item()
    step = BF16_EPS * want.abs().max().item()
    for S in (1, 3, 4, 16, 100):
        out = K.split_kv_decode(q, kc, vc, tables, lens, S)
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        e = (out.double() - want).abs().max().item()
        assert e <= 2 * e_unsplit + step, f"bf16 split {S}: error {e:.4f} > 2*{e_unsplit:.4f} + {step:.4f}"


@pytest.mark.parametrize("bad", [0, -1, -4])
def test_split_kv_rejects_non_positive_split_size(bad):
    """A split size < 1 is a bad launch: typed error (today -1 silently returns all zeros, 0 divides by zero)."""
    kc, vc, tables, lens, _, _ = _setup([5, 9], bs=4)
    with pytest.raises((BlockTableError, ValueError)) as ei:
        K.split_kv_decode(_q(2), kc, vc, tables, lens, bad)
    assert not isinstance(ei.value, ZeroDivisionError)


def test_split_kv_partials_rejects_too_few_splits():
    """``max_splits`` below the splits a sequence needs would silently drop keys: it must be rejected."""
    kc, vc, tables, lens, _, _ = _setup([16], bs=4)
    with pytest.raises((BlockTableError, ValueError)):
        K.split_kv_partials(_q(1), kc, vc, tables, lens, 4, max_splits=2)


# ----------------------------------------------------------------------------- merge of partial states

def _states_for(q, dk, dv, cuts, bs):
    """Partial states of one sequence cut at block boundaries ``cuts`` (block indices)."""
    L = dk.shape[0]
    states = []
    for lo_blk, hi_blk in zip(cuts, cuts[1:]):
        lo, hi = lo_blk * bs, min(hi_blk * bs, L)
        o = dense_attention_one(q, dk[lo:hi], dv[lo:hi]).float()
        lse = lse_one(q, dk[lo:hi]).float()
        states.append(PartialState(o, lse, lo_blk))
    return states


@settings(max_examples=examples(40))
@given(L=st.integers(1, 60), bs=st.sampled_from([1, 4, 8]), data=st.data())
def test_merge_states_random_shardings(L, bs, data):
    g = torch.Generator().manual_seed(L * 7 + bs)
    dk, dv = torch.randn(L, N_KV, D, generator=g), torch.randn(L, N_KV, D, generator=g)
    q = torch.randn(N_Q, D, generator=g)
    nblk = cdiv(L, bs)
    extra = data.draw(st.integers(0, 2), label="empty shards past the end")
    inner = data.draw(st.lists(st.integers(1, nblk + extra - 1), unique=True, max_size=6) if nblk + extra > 1
                      else st.just([]), label="cuts")
    cuts = [0] + sorted(inner) + [nblk + extra]
    states = _states_for(q, dk, dv, cuts, bs)
    shuffled = data.draw(st.permutations(states), label="order")
    o, lse = K.merge_states(list(shuffled))
    o_sorted, lse_sorted = K.merge_states(sorted(states, key=lambda s: s.global_block_index))
    assert torch.equal(o, o_sorted) and torch.equal(lse, lse_sorted), "merge must not depend on the input order"
    assert torch.isfinite(o).all()
    assert (o.double() - dense_attention_one(q, dk, dv)).abs().max() <= TOL, f"cuts {cuts}: merge != full attention"
    assert (lse.double() - lse_one(q, dk)).abs().max() <= TOL


def test_merge_states_sorts_by_global_block_index():
    """The fold order is the sorted order: feeding states reversed gives bitwise the sorted-order result,
    and that equals folding by hand with ``merge_two`` in ascending index order."""
    g = torch.Generator().manual_seed(0)
    states = [PartialState(torch.randn(3, N_Q, D, generator=g), torch.randn(3, N_Q, generator=g) * 5, idx)
              for idx in (7, 2, 40, 3, 11)]
    o, lse = K.merge_states(states[::-1])
    asc = sorted(states, key=lambda s: s.global_block_index)
    ho, hl = asc[0].o, asc[0].lse
    for s in asc[1:]:
        ho, hl = A.merge_two(ho, hl, s.o, s.lse)
    assert torch.equal(o, ho) and torch.equal(lse, hl)


def test_merge_states_empty_states_and_nan_payload():
    q = torch.randn(N_Q, D)
    dk, dv = torch.randn(6, N_KV, D), torch.randn(6, N_KV, D)
    full = PartialState(dense_attention_one(q, dk, dv).float(), lse_one(q, dk).float(), 1)
    empty = PartialState(torch.full((N_Q, D), float("nan")), torch.full((N_Q,), -math.inf), 0)
    empty2 = PartialState(torch.zeros(N_Q, D), torch.full((N_Q,), -math.inf), 5)
    o, lse = K.merge_states([empty2, full, empty])
    assert torch.isfinite(o).all(), "an empty state (lse=-inf) must contribute nothing, even with a NaN payload"
    assert torch.equal(o, full.o) or (o - full.o).abs().max() <= 1e-6
    o, lse = K.merge_states([empty2, PartialState(torch.zeros(N_Q, D), torch.full((N_Q,), -math.inf), 9)])
    assert torch.equal(o, torch.zeros(N_Q, D)) and torch.equal(lse, torch.full((N_Q,), -math.inf))


def test_merge_states_errors():
    a = PartialState(torch.zeros(N_Q, D), torch.zeros(N_Q), 3)
    b = PartialState(torch.ones(N_Q, D), torch.zeros(N_Q), 3)
    with pytest.raises(MergeError, match="duplicate"):
        K.merge_states([a, b])
    with pytest.raises(MergeError):
        K.merge_states([a, PartialState(torch.zeros(N_Q, D), torch.zeros(N_Q), 5), b])
    with pytest.raises(MergeError):
        K.merge_states([])
    with pytest.raises(MergeError):
        K.merge_states([a, PartialState(torch.zeros(N_Q + 1, D), torch.zeros(N_Q + 1), 4)])
    with pytest.raises(MergeError):
        K.merge_states([a, PartialState(torch.zeros(N_Q, D), torch.zeros(N_Q + 1), 4)])


# ----------------------------------------------------------------------------- paged prefill

def test_paged_prefill_several_sequences_with_padding_rows():
    """GQA, block boundaries, an empty-prefix sequence, a resume chunk, padding rows anywhere."""
    bs = 4
    lens = [11, 4, 9, 0]
    kc, vc, tables, tl, dk, dv = _setup(lens, bs=bs, seed=3)
    # queries: seq 0 resumes positions 7..10 (cached prefix 0..6), seq 1 a fresh prompt 0..3,
    # seq 2 one token at 8 (a single-token resume), padding rows interleaved
    rows = [(0, 7), (-1, -1), (0, 8), (1, 0), (0, 9), (1, 1), (1, 2), (-1, -1), (1, 3), (2, 8), (0, 10), (3, -1)]
    qidx = torch.tensor([max(b, 0) for b, _ in rows])
    qpos = torch.tensor([p for _, p in rows])
    q = torch.randn(len(rows), N_Q, D, generator=torch.Generator().manual_seed(1))
    out = K.paged_prefill(q, kc, vc, tables, tl, qidx, qpos)
    assert out.shape == q.shape and torch.isfinite(out).all()
    for t, (b, p) in enumerate(rows):
        if p < 0:
            assert torch.equal(out[t], torch.zeros(N_Q, D)), f"padding row {t} must be zeros"
        else:
            want = dense_attention_one(q[t], dk[b][:p + 1], dv[b][:p + 1])
            err = (out[t].double() - want).abs().max().item()
            assert err <= TOL, f"row {t} (seq {b}, pos {p}): differs from causal attention by {err:.2e}"


@settings(max_examples=examples(30))
@given(lens=st.lists(st.integers(1, 30), min_size=1, max_size=4), bs=st.sampled_from([1, 4, 8]), data=st.data())
def test_paged_prefill_random(lens, bs, data):
    kc, vc, tables, tl, dk, dv = _setup(lens, bs=bs, seed=sum(lens))
    rows = []
    for b, L in enumerate(lens):
        start = data.draw(st.integers(0, L - 1), label="prefix")
        rows += [(b, p) for p in range(start, L)]
    rows += [(0, -1)] * data.draw(st.integers(0, 3), label="padding")
    rows = data.draw(st.permutations(rows), label="row order")
    q = torch.randn(len(rows), N_Q, D, generator=torch.Generator().manual_seed(len(rows)))
    out = K.paged_prefill(q, kc, vc, tables, tl, torch.tensor([b for b, _ in rows]), torch.tensor([p for _, p in rows]))
    assert torch.isfinite(out).all()
    for t, (b, p) in enumerate(rows):
        want = torch.zeros(N_Q, D, dtype=torch.float64) if p < 0 else dense_attention_one(q[t], dk[b][:p + 1], dv[b][:p + 1])
        assert (out[t].double() - want).abs().max() <= TOL


# ----------------------------------------------------------------------------- launch guards

def _guard_cases():
    """(description, tables, seq_lens) that must all fail the guards; caches have 6 pages of 4 slots."""
    t = lambda rows: torch.tensor(rows, dtype=torch.long)  # noqa: E731
    lens = torch.tensor([5, 3])
    return [
        ("page id == num_blocks", t([[0, 6, -1], [2, -1, -1]]), lens),
        ("page id far out of range", t([[0, 1, -1], [99, -1, -1]]), lens),
        ("negative page id inside the length", t([[0, -1, -1], [2, -1, -1]]), lens),
        ("-2 inside the length", t([[0, -2, -1], [2, -1, -1]]), lens),
        ("table too short", t([[0], [2]]), lens),
        ("non -1 entry after the end", t([[0, 1, 3], [2, -1, -1]]), lens),
        ("zero entry after the end", t([[0, 1, -1], [2, 0, -1]]), lens),
        ("duplicate page within a sequence", t([[4, 4, -1], [2, -1, -1]]), lens),
        ("duplicate page, non-adjacent", t([[3, 0, 3], [2, -1, -1]]), torch.tensor([9, 3])),
        ("negative length", t([[0, 1, -1], [2, -1, -1]]), torch.tensor([5, -1])),
        ("rows != lengths", t([[0, 1, -1], [2, -1, -1]]), torch.tensor([5, 3, 1])),
        ("length past the table", t([[0, 1, -1], [2, -1, -1]]), torch.tensor([13, 3])),
    ]


def test_pages_shared_across_sequences_pass_the_guards():
    """Group prefix sharing: two sequences may read one page (writes are guarded per step elsewhere)."""
    from reference.attention import check_block_tables
    check_block_tables(torch.tensor([[0, 1, -1], [0, -1, -1]]), torch.tensor([5, 3]), 6, 4)


def test_pages_shared_across_sequences_are_read_correctly():
    """Group prefix sharing: two sequences' tables name the same full page; each reads it correctly."""
    bs = 4
    g = torch.Generator().manual_seed(5)
    kc = torch.full((6, bs, N_KV, D), float("nan"))
    vc = torch.full((6, bs, N_KV, D), float("nan"))
    prefix_k, prefix_v = torch.randn(bs, N_KV, D, generator=g), torch.randn(bs, N_KV, D, generator=g)
    kc[2], vc[2] = prefix_k, prefix_v                      # the shared prompt page
    dk, dv = [], []
    for page, n in ((4, 3), (5, 2)):                       # each sequence's own tail page
        tk, tv = torch.randn(n, N_KV, D, generator=g), torch.randn(n, N_KV, D, generator=g)
        kc[page, :n], vc[page, :n] = tk, tv
        dk.append(torch.cat([prefix_k, tk]))
        dv.append(torch.cat([prefix_v, tv]))
    tables = torch.tensor([[2, 4], [2, 5]])
    lens = torch.tensor([bs + 3, bs + 2])
    q = _q(2, seed=4)
    for S in (None, 1, 3, 100):
        out = K.split_kv_decode(q, kc, vc, tables, lens, S)
        assert (out.double() - _expected(q, dk, dv, [7, 6])).abs().max() <= TOL, f"split {S}"
    rows = [(0, 6), (1, 5), (1, 3)]
    qq = torch.randn(3, N_Q, D, generator=g)
    out = K.paged_prefill(qq, kc, vc, tables, lens, torch.tensor([b for b, _ in rows]), torch.tensor([p for _, p in rows]))
    for t, (b, p) in enumerate(rows):
        assert (out[t].double() - dense_attention_one(qq[t], dk[b][:p + 1], dv[b][:p + 1])).abs().max() <= TOL


def _snap(*ts):
    return [t.clone() for t in ts]


def _same(a, b):
    return all(torch.equal(torch.nan_to_num(x, nan=1234.5), torch.nan_to_num(y, nan=1234.5)) for x, y in zip(a, b))


@pytest.mark.parametrize("case", _guard_cases(), ids=lambda c: c[0])
def test_kernel_guards_reject_bad_tables(case):
    _, tables, lens = case
    kc = torch.full((6, 4, N_KV, D), float("nan"))
    kc[:, :] = torch.randn(6, 4, N_KV, D)
    vc = kc.clone() * 2
    before = _snap(kc, vc, tables, lens)
    B = lens.shape[0]
    q = _q(B)
    with pytest.raises(BlockTableError):
        K.split_kv_decode(q, kc, vc, tables, lens, 2)
    with pytest.raises(BlockTableError):
        K.split_kv_partials(q, kc, vc, tables, lens, 2)
    qidx = torch.zeros(2, dtype=torch.long)
    qpos = torch.tensor([0, 1])
    with pytest.raises(BlockTableError):
        K.paged_prefill(torch.randn(2, N_Q, D), kc, vc, tables, lens, qidx, qpos)
    assert _same(before, [kc, vc, tables, lens]), "a rejected launch modified its inputs"


@pytest.mark.parametrize("qidx,qpos", [([0, 0], [4, 5]), ([1], [3]), ([0, 1], [0, 7]), ([2], [0]), ([-1], [0]),
                                       ([0, 0], [0]), ([[0]], [[0]])])
def test_kernel_guards_reject_query_positions_not_in_cache(qidx, qpos):
    kc = torch.randn(6, 4, N_KV, D)
    tables = torch.tensor([[0, 1, -1], [2, -1, -1]])
    lens = torch.tensor([5, 3])
    qi, qp = torch.tensor(qidx), torch.tensor(qpos)
    with pytest.raises(BlockTableError):
        K.paged_prefill(torch.randn(max(qi.numel(), 1), N_Q, D), kc, kc, tables, lens, qi, qp)


def test_engine_kernels_is_the_guarded_entry_point(engine):
    """``engine.kernels`` exposes the three entry points and applies the guards."""
    ks = engine.kernels
    for name in ("paged_prefill", "split_kv_decode", "split_kv_partials", "merge_states"):
        assert callable(getattr(ks, name))
    kc = torch.randn(3, 4, N_KV, D)
    with pytest.raises(BlockTableError):
        ks.split_kv_decode(_q(1), kc, kc, torch.tensor([[0, 3]]), torch.tensor([5]), None)
    ok = ks.split_kv_decode(_q(1), kc, kc, torch.tensor([[0, 2]]), torch.tensor([5]), None)
    assert torch.isfinite(ok).all()


def test_reduce_splits_agrees_with_the_pairwise_fold():
    """``reduce_splits`` (one maximum, in-order sums of the weights and weighted states, one division)
    against folding with ``merge_two`` in order, both in float32, each against the float64 value of the
    same fold: the reduce's error is at most 2 x the pairwise fold's + one float32 rounding step of the
    result (the LOGIT rule, DESIGN 4). Empty splits (lse -inf, a NaN payload) add nothing either way."""
    g = torch.Generator().manual_seed(3)
    B, S = 3, 17
    o = torch.randn(B, S, N_Q, D, generator=g)
    lse = torch.randn(B, S, N_Q, generator=g) * 6
    lse[0, 5] = -math.inf                                  # empty splits, NaN payloads
    o[0, 5] = float("nan")
    lse[1] = -math.inf                                     # a sequence with no keys at all
    lse[2, 1:] = -math.inf
    o[2, 1:] = float("nan")
    out, out_lse = A.reduce_splits(o, lse)
    po, pl = o[:, 0], lse[:, 0]
    for k in range(1, S):
        po, pl = A.merge_two(po, pl, o[:, k], lse[:, k])
    xo, xl = A.reduce_splits(o.double(), lse.double())
    assert torch.equal(out[1], torch.zeros(N_Q, D)) and torch.isneginf(out_lse[1]).all()
    assert torch.isfinite(out[[0, 2]]).all() and torch.isfinite(out_lse[[0, 2]]).all()
    live = [0, 2]                                          # the sequences with keys
    for mine, pair, exact in ((out[live], po[live], xo[live]), (out_lse[live], pl[live], xl[live])):
        step = torch.finfo(torch.float32).eps * exact.abs().max()
        err, ref_err = (mine.double() - exact).abs().max(), (pair.double() - exact).abs().max()
        print(f"reduce_splits max err {err:.3e}, pairwise fold {ref_err:.3e}")
        assert err <= 2 * ref_err + step
