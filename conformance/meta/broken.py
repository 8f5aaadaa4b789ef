"""Deliberately broken engines (the reference with one bug each), as ``--engine`` factories.

Each must be caught by the named clause:

* ``forgets_pending``  (TURN): resume skips the pending token's K/V (its slot is never written).
* ``reprefills``       (MEM): resume drops the cached KV and re-prefills the whole context (tokens stay right).
* ``nan_empty_splits`` (SPLITK): ``engine.kernels`` split-KV writes NaN for empty splits and merges without guards.
* ``leaks_block``      (MEM): ``rollout_finish`` keeps one page out of the free list.
* ``decode_skips_newest`` (ORACLE): decode steps attend over every cached key but the newest (the token being
  decoded): an off-by-one in the decode length that rollouts and ``generate`` share, so TURN cannot see it.
"""

from __future__ import annotations

import dataclasses

import torch

import reference
from reference import attention
from reference.kernels import ReferenceKernels
from reference.runner import ReferenceRunner

from .. import engines
from ..engines import _config, _weights


class ForgetsPending(reference.Engine):
    def rollout_continue(self, sid, observation_ids=()):
        super().rollout_continue(sid, observation_ids)
        seq = self._seqs[sid]
        if seq.num_cached < seq.num_tokens - 1:      # pretend the pending token is cached: it never gets K/V
            seq.num_cached += 1


class Reprefills(reference.Engine):
    def rollout_continue(self, sid, observation_ids=()):
        super().rollout_continue(sid, observation_ids)
        self.scheduler.drop_kv(self._seqs[sid])      # forget the cached context: it is recomputed from token 0


class LeaksBlock(reference.Engine):
    def rollout_finish(self, sid):
        seq = self._seq(sid)
        if seq.block_table:
            seq.block_table.pop()                    # this page never returns to the pool
        return super().rollout_finish(sid)


class NaNSplitKernels(ReferenceKernels):
    """Split-KV without the empty-split guards: ``o = NaN`` for empty splits and a naive log-sum-exp merge."""

    def split_kv_partials(self, q, k_cache, v_cache, block_tables, seq_lens, split_size, scale=None, max_splits=None):
        o, lse = super().split_kv_partials(q, k_cache, v_cache, block_tables, seq_lens, split_size, scale, max_splits)
        o = torch.where(torch.isneginf(lse)[..., None], torch.full_like(o, float("nan")), o)
        return o, lse

    def split_kv_decode(self, q, k_cache, v_cache, block_tables, seq_lens, split_size, scale=None):
        if split_size is None:
            split_size = max([int(x) for x in seq_lens] + [1])
        o, lse = self.split_kv_partials(q, k_cache, v_cache, block_tables, seq_lens, split_size, scale)
        m = lse.max(dim=1, keepdim=True).values                     # -inf for an empty sequence
        w = torch.exp(lse - m)                                      # exp(-inf - -inf) = NaN
        out = (w[..., None] * o).sum(1) / w.sum(1)[..., None]       # 0 * NaN = NaN
        return out.to(q.dtype)

    def merge_states(self, states):
        order = attention.ordered_states(states)
        lse = torch.stack([s.lse for s in order])
        o = torch.stack([s.o for s in order])
        m = lse.max(0).values
        w = torch.exp(lse - m)
        return (w[..., None] * o).sum(0) / w.sum(0)[..., None], m + torch.log(w.sum(0))


class NaNEmptySplits(reference.Engine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernels = NaNSplitKernels(self.dtype)


class ShortDecodeRunner(ReferenceRunner):
    def execute(self, batch):
        if batch.kind == "decode":                   # attend over seq_len - 1 keys: the newest one is left out
            batch = dataclasses.replace(batch, seq_lens=batch.seq_lens - 1)
        return super().execute(batch)


class DecodeSkipsNewest(reference.Engine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runner.__class__ = ShortDecodeRunner


def _factory(cls):
    def factory(model, weights=None, **engine_kwargs):
        cfg = _config(model)
        return cls.from_state_dict(cfg, _weights(cfg, weights), **engine_kwargs)
    factory.__name__ = cls.__name__
    return factory


forgets_pending = _factory(ForgetsPending)
reprefills = _factory(Reprefills)
leaks_block = _factory(LeaksBlock)
nan_empty_splits = _factory(NaNEmptySplits)
decode_skips_newest = _factory(DecodeSkipsNewest)

def ignores_invariant(model, weights=None, **engine_kwargs):
    """Accepts batch_invariant=True but runs the ordinary (batch-dependent) path."""
    engine_kwargs.pop("batch_invariant", None)
    return engines.reference(model, weights, **engine_kwargs)


#: factory name -> the clause that must catch it (and the pytest -m / -k selection that runs it quickly)
EXPECTED = {
    "forgets_pending": ("TURN", "test_multi_turn_equals_single_shot"),
    "reprefills": ("MEM", "test_resume_grows_by_delta_only"),
    "nan_empty_splits": ("SPLITK", "test_every_split_size or test_partials_empty_splits_and_merge"),
    "leaks_block": ("MEM", "test_no_leak_after_finish"),
    "decode_skips_newest": ("ORACLE", "test_free_running_oracle"),
    "ignores_invariant": ("INVARIANT", "test_bitwise_across_batch_mates_and_turn_splits"),
}


def declines_d16(model, weights=None, **engine_kwargs):
    """The reference, but declaring (like the optimized engine does for its kernels) that it does not
    support head_dim 16: the harness must skip those shapes with the reason, never count them as passes."""
    return engines.reference(model, weights, **engine_kwargs)


declines_d16.supports = lambda cfg, **kw: "head_dim 16" if cfg.head_dim == 16 else None  # type: ignore[attr-defined]
