"""Checks of ``engine.kernels`` (SPLITK, PAGED): inputs built in float32 on the CPU, moved to the kernels' device and
dtype; outputs compared with a dense float32 oracle over the dtype-rounded inputs by the LOGIT rule."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, given, settings

from reference import attention
from reference.attention import PartialState

from . import cases, oracles
from .harness import Case, Repro, to_kernel
from .tolerance import ErrorStats, RuleCheck, as_dtype


def run_examples(examples: int, strategy, body) -> None:
    """Run ``body(example)`` over seeded hypothesis examples (deterministic: derandomized, no database)."""
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def inner(x):
        body(x)

    inner()


def rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What the kernel actually sees: ``t`` rounded to ``dtype``, back in float32."""
    return t.to(dtype).float()


def _cpu(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu", torch.float32)


def kv_repro(case: Case, spec: cases.KVSpec, lines: list[str]) -> Repro:
    r = Repro(case.repro.lines[:case.repro.setup_len])
    r.add(f"spec = {spec!r}")
    r.add("kv = build_kv(spec)")
    for line in lines:
        r.add(line)
    return r


_ARGS = ("on_kernel(q, eng), on_kernel(kv.k_cache, eng), on_kernel(kv.v_cache, eng), "
         "on_kernel(kv.block_tables, eng, False), on_kernel(kv.seq_lens, eng, False)")


# ---------------------------------------------------------------------------------- SPLITK


def kv_specs(case: Case, max_blocks: int = 5) -> st.SearchStrategy:
    bs = case.block_size
    cfg = case.cfg
    near = sorted({n for k in range(0, max_blocks + 1) for n in (k * bs - 1, k * bs, k * bs + 1) if n >= 0})
    length = st.one_of(st.sampled_from(near), st.integers(0, max_blocks * bs + 3))
    return st.builds(
        cases.KVSpec, seed=st.integers(0, 2**16), n_q=st.just(cfg.num_attention_heads),
        n_kv=st.just(cfg.num_key_value_heads), head_dim=st.just(cfg.head_dim), block_size=st.just(bs),
        lens=st.lists(length, min_size=1, max_size=4).map(tuple), extra_pages=st.integers(0, 3),
        shuffle=st.booleans())


def check_split_decode(case: Case, kern: Any, spec: cases.KVSpec, split_sizes: list[int | None]) -> int:
    """``split_kv_decode`` for each split size: NaN-free, zero for empty sequences, the LOGIT rule vs the dense
    oracle. Returns the number of calls checked."""
    dtype = as_dtype(getattr(kern, "dtype", torch.float32))
    kv = cases.build_kv(spec)
    B = len(spec.lens)
    q = cases.build_queries(spec.seed, B, spec.n_q, spec.head_dim)
    qd, kd, vd = rounded(q, dtype), rounded(kv.k_cache, dtype), rounded(kv.v_cache, dtype)
    oracle = torch.stack([
        oracles.dense_attention(qd[b:b + 1], oracles.gather(kd, kv.block_tables[b], n),
                                oracles.gather(vd, kv.block_tables[b], n), torch.ones(1, n, dtype=torch.bool))[0]
        for b, n in enumerate(spec.lens)])                                          # [B, n_q, D]
    args = [to_kernel(q, kern), to_kernel(kv.k_cache, kern), to_kernel(kv.v_cache, kern),
            to_kernel(kv.block_tables, kern, False), to_kernel(kv.seq_lens, kern, False)]
    for size in split_sizes:
        rep = kv_repro(case, spec, [f"q = build_queries(spec.seed, {B}, spec.n_q, spec.head_dim)",
                                    f"out = eng.kernels.split_kv_decode({_ARGS}, {size!r})"])
        try:
            got = _cpu(kern.split_kv_decode(*args, size))
        except Exception as e:  # noqa: BLE001
            case.clause_fail(f"split_kv_decode(split_size={size}) raised {type(e).__name__}: {e}", rep)
        if tuple(got.shape) != (B, spec.n_q, spec.head_dim):
            case.clause_fail(f"split_kv_decode(split_size={size}) returned shape {tuple(got.shape)}, "
                             f"expected {(B, spec.n_q, spec.head_dim)}", rep)
        if not torch.isfinite(got).all():
            bad = sorted({int(b) for b in torch.nonzero(~torch.isfinite(got))[:, 0]})
            case.clause_fail(f"split_kv_decode(split_size={size}) produced NaN/inf for sequences {bad} "
                             f"(lens {[spec.lens[b] for b in bad]}; empty splits or stale NaN pages reached the math)", rep)
        for b, n in enumerate(spec.lens):
            if n == 0 and not torch.equal(got[b], torch.zeros_like(got[b])):
                case.clause_fail(f"split_kv_decode(split_size={size}): sequence {b} has no keys, its output must be 0", rep)
        ref = attention.split_kv_decode(q.to(dtype), kv.k_cache.to(dtype), kv.v_cache.to(dtype), kv.block_tables,
                                        kv.seq_lens, size).float()
        rule = RuleCheck.of(ErrorStats.of(got, oracle), ErrorStats.of(ref, oracle), dtype)
        if not rule.ok:
            case.clause_fail(f"split_kv_decode(split_size={size}) vs the unsplit fp32 oracle: {rule.describe()}", rep)
    return len(split_sizes)


def check_partials_and_merge(case: Case, kern: Any, spec: cases.KVSpec, split_size: int, extra_splits: int) -> None:
    """``split_kv_partials`` with trailing empty splits (``max_splits`` beyond the need): empty splits are exactly
    ``o = 0, lse = -inf``; the others match the oracle's per-split state; ``merge_states`` of the partials,
    shuffled, equals the unsplit oracle, NaN-free."""
    dtype = as_dtype(getattr(kern, "dtype", torch.float32))
    kv = cases.build_kv(spec)
    B = len(spec.lens)
    q = cases.build_queries(spec.seed, B, spec.n_q, spec.head_dim)
    S = max([attention.num_splits(n, split_size) for n in spec.lens] + [1]) + extra_splits
    rep = kv_repro(case, spec, [f"q = build_queries(spec.seed, {B}, spec.n_q, spec.head_dim)",
                                f"o, lse = eng.kernels.split_kv_partials({_ARGS}, {split_size}, None, {S})"])
    try:
        o, lse = kern.split_kv_partials(to_kernel(q, kern), to_kernel(kv.k_cache, kern), to_kernel(kv.v_cache, kern),
                                        to_kernel(kv.block_tables, kern, False), to_kernel(kv.seq_lens, kern, False),
                                        split_size, None, S)
    except Exception as e:  # noqa: BLE001
        case.clause_fail(f"split_kv_partials raised {type(e).__name__}: {e}", rep)
    o, lse = _cpu(o), _cpu(lse)
    if tuple(o.shape) != (B, S, spec.n_q, spec.head_dim) or tuple(lse.shape) != (B, S, spec.n_q):
        case.clause_fail(f"split_kv_partials shapes o {tuple(o.shape)}, lse {tuple(lse.shape)}; expected "
                         f"{(B, S, spec.n_q, spec.head_dim)} and {(B, S, spec.n_q)}", rep)
    qd, kd, vd = rounded(q, dtype), rounded(kv.k_cache, dtype), rounded(kv.v_cache, dtype)
    ro, rl = attention.split_kv_partials(q.to(dtype), kv.k_cache.to(dtype), kv.v_cache.to(dtype), kv.block_tables,
                                         kv.seq_lens, split_size, None, S)
    for b, n in enumerate(spec.lens):
        keys = oracles.gather(kd, kv.block_tables[b], n)
        vals = oracles.gather(vd, kv.block_tables[b], n)
        for k in range(S):
            a, z = k * split_size, min((k + 1) * split_size, n)
            where = f"sequence {b} (len {n}) split {k} [{a}, {max(a, z)})"
            if a >= z:
                if not (torch.equal(o[b, k], torch.zeros_like(o[b, k])) and bool(torch.isneginf(lse[b, k]).all())):
                    big = float(o[b, k].nan_to_num().abs().max())
                    case.clause_fail(f"split_kv_partials: empty {where} must be o = 0, lse = -inf; got o with "
                                     f"{int(torch.isnan(o[b, k]).sum())} NaN, max |o| {big:.3g}, "
                                     f"lse {lse[b, k].tolist()}", rep)
                continue
            vis = torch.ones(1, z - a, dtype=torch.bool)
            o_or = oracles.dense_attention(qd[b:b + 1], keys[a:z], vals[a:z], vis)[0]
            l_or = oracles.dense_lse(qd[b], keys[a:z])
            for what, got, ref, orc in (("o", o[b, k], ro[b, k], o_or), ("lse", lse[b, k], rl[b, k], l_or)):
                rule = RuleCheck.of(ErrorStats.of(got, orc), ErrorStats.of(ref, orc), dtype)
                if not rule.ok:
                    case.clause_fail(f"split_kv_partials {what} of {where}: {rule.describe()}", rep)
    # merge: the partials as shuffled PartialStates (global_block_index = split index), one sequence at a time
    dev = getattr(kern, "device", "cpu")
    for b, n in enumerate(spec.lens):
        order = list(range(S))
        order = order[1::2] + order[0::2]
        states = [PartialState(o[b, k].to(dev), lse[b, k].to(dev), k) for k in order]
        mrep = Repro(rep.lines + [f"states = [PartialState(o[{b}, k], lse[{b}, k], k) for k in {order}]",
                                  "mo, ml = eng.kernels.merge_states(states)"])
        try:
            mo, ml = kern.merge_states(states)
        except Exception as e:  # noqa: BLE001
            case.clause_fail(f"merge_states raised {type(e).__name__}: {e}", mrep)
        mo, ml = _cpu(mo), _cpu(ml)
        if not torch.isfinite(mo).all() or torch.isnan(ml).any():
            case.clause_fail(f"merge_states of sequence {b} (len {n}, {S} states) produced NaN", mrep)
        if n == 0:
            if not (torch.equal(mo, torch.zeros_like(mo)) and bool(torch.isneginf(ml).all())):
                case.clause_fail("merge_states of only empty states must give o = 0, lse = -inf", mrep)
            continue
        keys = oracles.gather(kd, kv.block_tables[b], n)
        o_or = oracles.dense_attention(qd[b:b + 1], keys, oracles.gather(vd, kv.block_tables[b], n),
                                       torch.ones(1, n, dtype=torch.bool))[0]
        l_or = oracles.dense_lse(qd[b], keys)
        ref_o, ref_l = attention.merge_states([PartialState(ro[b, k], rl[b, k], k) for k in order])
        for what, got, ref, orc in (("o", mo, ref_o, o_or), ("lse", ml, ref_l, l_or)):
            rule = RuleCheck.of(ErrorStats.of(got, orc), ErrorStats.of(ref, orc), dtype)
            if not rule.ok:
                case.clause_fail(f"merge_states {what} of sequence {b} vs the unsplit oracle: {rule.describe()}", mrep)


# ---------------------------------------------------------------------------------- PAGED


def prefill_specs(case: Case, max_blocks: int = 5) -> st.SearchStrategy:
    @st.composite
    def strat(draw):
        kv = draw(kv_specs(case, max_blocks).filter(lambda s: all(n >= 1 for n in s.lens)))
        bs = case.block_size
        starts = []
        for n in kv.lens:
            cands = sorted({0, n - 1} | {k * bs + d for k in range(0, n // bs + 1) for d in (-1, 0, 1)
                                         if 0 <= k * bs + d < n})
            starts.append(draw(st.one_of(st.sampled_from(cands), st.integers(0, n - 1))))
        return cases.PrefillSpec(kv, tuple(starts), draw(st.integers(0, 3)))
    return strat()


def check_prefill(case: Case, kern: Any, spec: cases.PrefillSpec) -> None:
    """``paged_prefill``: padding rows exactly 0, real rows NaN-free and by the LOGIT rule vs dense causal attention
    over the sequence's keys ``0 .. q_pos``."""
    dtype = as_dtype(getattr(kern, "dtype", torch.float32))
    kv, q, qidx, qpos = cases.build_prefill(spec)
    T = q.shape[0]
    rep = kv_repro(case, spec.kv, [f"pspec = PrefillSpec(spec, {spec.starts!r}, {spec.pad_rows})",
                                   "kv, q, qidx, qpos = build_prefill(pspec)",
                                   f"out = eng.kernels.paged_prefill({_ARGS}, on_kernel(qidx, eng, False), "
                                   "on_kernel(qpos, eng, False))"])
    try:
        got = kern.paged_prefill(to_kernel(q, kern), to_kernel(kv.k_cache, kern), to_kernel(kv.v_cache, kern),
                                 to_kernel(kv.block_tables, kern, False), to_kernel(kv.seq_lens, kern, False),
                                 to_kernel(qidx, kern, False), to_kernel(qpos, kern, False))
    except Exception as e:  # noqa: BLE001
        case.clause_fail(f"paged_prefill raised {type(e).__name__}: {e}", rep)
    got = _cpu(got)
    if tuple(got.shape) != (T, spec.kv.n_q, spec.kv.head_dim):
        case.clause_fail(f"paged_prefill returned {tuple(got.shape)}, expected {(T, spec.kv.n_q, spec.kv.head_dim)}", rep)
    pad = qpos < 0
    if pad.any() and not torch.equal(got[pad], torch.zeros_like(got[pad])):
        case.clause_fail(f"paged_prefill: padding rows {torch.nonzero(pad).flatten().tolist()} must be exactly 0", rep)
    if not torch.isfinite(got).all():
        rows = sorted({int(t) for t in torch.nonzero(~torch.isfinite(got))[:, 0]})
        case.clause_fail(f"paged_prefill produced NaN/inf in rows {rows} (q_pos {[int(qpos[t]) for t in rows]}; "
                         "a masked or stale key reached the math)", rep)
    qd, kd, vd = rounded(q, dtype), rounded(kv.k_cache, dtype), rounded(kv.v_cache, dtype)
    oracle = torch.zeros(T, spec.kv.n_q, spec.kv.head_dim)
    for b in range(len(spec.kv.lens)):
        rows = torch.nonzero((qidx == b) & (qpos >= 0)).flatten()
        if rows.numel() == 0:
            continue
        L = int(qpos[rows].max()) + 1
        vis = torch.arange(L)[None, :] <= qpos[rows][:, None].long()
        oracle[rows] = oracles.dense_attention(qd[rows], oracles.gather(kd, kv.block_tables[b], L),
                                               oracles.gather(vd, kv.block_tables[b], L), vis)
    ref = attention.paged_prefill(q.to(dtype), kv.k_cache.to(dtype), kv.v_cache.to(dtype), kv.block_tables,
                                  kv.seq_lens, qidx, qpos).float()
    real = ~pad
    rule = RuleCheck.of(ErrorStats.of(got[real], oracle[real]), ErrorStats.of(ref[real], oracle[real]), dtype)
    if not rule.ok:
        case.clause_fail(f"paged_prefill vs dense causal attention ({int(real.sum())} rows, starts {spec.starts}, "
                         f"lens {spec.kv.lens}): {rule.describe()}", rep)
