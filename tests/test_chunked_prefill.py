"""Chunked prefill and single-token resume give the logits and tokens of one full prefill."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import SamplingParams
from reference.config import EngineConfig
from reference.kv_cache import BlockManager, KVCache
from reference.scheduler import Scheduler
from reference.sequence import Sequence
from reference.oracle import dense_logits

from _helpers import cdiv, check_pool_accounting, drive, rand_ids, tiny_engine

TOL = 1e-5


@torch.no_grad()
def chunked_logits(engine, ids: list[int], chunks: list[int], bs: int, seed: int = 0) -> torch.Tensor:
    """Prefill ``ids`` chunk by chunk through ``engine.kernels.paged_prefill`` (guards on) over
    shuffled, NaN-initialised pages; returns the logits of every position ``[T, V]``."""
    assert sum(chunks) == len(ids)
    model, cfg = engine.model, engine.model_config
    n = cdiv(len(ids), bs)
    N = n + 3
    kv = KVCache(cfg.num_hidden_layers, N, bs, cfg.num_key_value_heads, cfg.head_dim)
    pages = torch.randperm(N, generator=torch.Generator().manual_seed(seed))[:n]
    out, start = [], 0
    for c in chunks:
        end = start + c
        pos = torch.arange(start, end)
        used = cdiv(end, bs)
        table = torch.full((1, n + 1), -1, dtype=torch.long)
        table[0, :used] = pages[:used]
        slots = table[0, pos // bs] * bs + pos % bs
        lens = torch.tensor([end])
        qidx = torch.zeros(c, dtype=torch.long)

        def attend(layer, q, k, v, slots=slots, table=table, lens=lens, qidx=qidx, pos=pos):
            kv.write(layer, slots, k, v)
            return engine.kernels.paged_prefill(q, kv.k[layer], kv.v[layer], table, lens, qidx, pos)

        out.append(model.logits(model.forward(torch.tensor(ids[start:end]), pos, attend)))
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("bs", [4, 8, 16])
@pytest.mark.parametrize("chunks", [[13, 14], [9, 9, 9], [26, 1], [1, 25, 1], [16, 11], [5, 7, 15]])
def test_chunked_prefill_logits_equal_full(bs, chunks):
    eng = tiny_engine(block_size=bs)
    ids = rand_ids(random.Random(bs), 27)
    full = chunked_logits(eng, ids, [27], bs)
    got = chunked_logits(eng, ids, chunks, bs, seed=1)
    assert torch.isfinite(got).all(), "NaN from a stale page leaked into the logits"
    err = (got - full).abs().max().item()
    assert err <= TOL, f"chunks {chunks}, block {bs}: logits differ from one full prefill by {err:.2e}"
    assert torch.equal(got.argmax(-1), full.argmax(-1))
    dense = dense_logits(eng.model, ids)
    assert (full - dense).abs().max().item() <= TOL
    assert (eng.score(ids) - dense).abs().max().item() <= TOL


def test_single_token_resume_logits_equal_full():
    """A resume of one token (the pending token, empty observation) over a cached prefix."""
    eng = tiny_engine(block_size=4)
    ids = rand_ids(random.Random(0), 33)
    full = chunked_logits(eng, ids, [33], 4)
    for split in ([32, 1], [31, 1, 1], [8, 1, 23, 1]):
        got = chunked_logits(eng, ids, split, 4, seed=2)
        err = (got - full).abs().max().item()
        assert err <= TOL, f"resume chunks {split}: logits differ by {err:.2e}"


def _record_steps(eng):
    steps = []
    orig = eng._execute

    def wrapped(batch):
        steps.append((batch.kind, batch.num_tokens, [s.seq_id for s in batch.seqs], list(batch.chunks)))
        return orig(batch)
    eng._execute = wrapped
    return steps


@pytest.mark.parametrize("chunking", ["even", "greedy"])
@pytest.mark.parametrize("budget", [3, 7, 16])
def test_generate_with_small_token_budget_equals_unchunked(budget, chunking):
    rng = random.Random(budget)
    prompts = [rand_ids(rng, n) for n in (20, 9, 33, 1)]
    sp = SamplingParams(max_tokens=6, stop_token_ids=(), logprobs=True)
    big = tiny_engine(block_size=8)
    small = tiny_engine(block_size=8, max_num_batched_tokens=budget, prefill_chunking=chunking)
    steps = _record_steps(small)
    ref_toks = big.generate(prompts, sp)
    got = small.generate(prompts, sp)
    assert got == ref_toks, f"budget {budget}: chunked prefill changed greedy tokens"
    prefill = [s for s in steps if s[0] == "prefill"]
    assert max(s[1] for s in prefill) <= budget, "a prefill step exceeded max_num_batched_tokens"
    chunks_of_33 = sum(1 for s in prefill if 2 in s[2])
    assert chunks_of_33 >= cdiv(33, budget), f"the 33-token prompt was prefilled in {chunks_of_33} steps"
    # sampled: also identical (positions and seeds do not depend on chunking)
    spr = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=5, stop_token_ids=(), seed=5)
    assert small.generate(prompts, spr) == big.generate(prompts, spr)


def _logprobs_by_turn(recs):
    return [[lp for o in r.outputs for lp in o.logprobs] for r in recs]


@pytest.mark.parametrize("chunking", ["even", "greedy"])
@pytest.mark.parametrize("budget", [2, 5, 11])
def test_multiturn_with_chunked_resume(budget, chunking):
    """Long observations resumed in several chunks: same trajectories as unchunked, logprobs within 1e-5."""
    bs = 4
    rng = random.Random(budget)
    specs = [(rand_ids(rng, n), SamplingParams(max_tokens=4, stop_token_ids=(), logprobs=True)) for n in (6, 13)]
    obs_lens = [3 * bs + 1, 0, 1, 2 * bs]

    def obs_fn(i, k, t):
        return rand_ids(random.Random(100 * i + k), obs_lens[(i + k) % 4])
    small = tiny_engine(block_size=bs, max_num_batched_tokens=budget, prefill_chunking=chunking)
    steps = _record_steps(small)
    a = drive(small, specs, 4, obs_fn, check_pool=check_pool_accounting)
    b = drive(tiny_engine(block_size=bs), specs, 4, obs_fn)
    assert max(s[1] for s in steps if s[0] == "prefill") <= budget
    for ra, rb in zip(a, b):
        assert ra.trajectory.token_ids == rb.trajectory.token_ids
        assert [o.prefilled_tokens for o in ra.outputs] == [o.prefilled_tokens for o in rb.outputs]
        d = max(abs(x - y) for x, y in zip(ra.trajectory.logprobs, rb.trajectory.logprobs))
        assert d <= TOL, f"budget {budget}: logprobs differ from the unchunked run by {d:.2e}"


def _prefill_plan(lengths: list[int], budget: int, chunking: str, max_num_seqs: int | None = None,
                  ) -> list[list[tuple[int, int]]]:
    """The prefill steps the scheduler builds for fresh prompts of ``lengths`` (a pool that holds them all),
    as ``[(seq_id, chunk), ...]`` per step; each step's chunks are applied as the engine would."""
    bs = 4
    cfg = EngineConfig(block_size=bs, num_blocks=sum(cdiv(n, bs) for n in lengths) + 1, max_num_batched_tokens=budget,
                       max_num_seqs=max_num_seqs or len(lengths), prefill_chunking=chunking)
    sched = Scheduler(cfg, BlockManager(cfg.num_blocks, bs))
    for i, n in enumerate(lengths):
        sched.add(Sequence(i, SamplingParams(), True, list(range(1, n + 1)), n))
    plan = []
    while (batch := sched._schedule_prefill()) is not None:
        assert batch.kind == "prefill"
        plan.append([(s.seq_id, c) for s, c in zip(batch.seqs, batch.chunks)])
        for s, c in zip(batch.seqs, batch.chunks):
            s.num_cached += c
            s.prefill_done = s.num_cached == s.num_tokens
    return plan


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 80), min_size=1, max_size=9), budget=st.integers(1, 96))
def test_even_chunking_takes_the_fewest_steps_in_near_equal_shares(lengths, budget):
    """``prefill_chunking="even"``: ceil(T / budget) steps (greedy's count), none over the budget, the largest and the
    smallest one token apart at most, every sequence's chunks in order summing to its prompt; greedy fills every
    step but the last to the budget."""
    total = sum(lengths)
    even, greedy = _prefill_plan(lengths, budget, "even"), _prefill_plan(lengths, budget, "greedy")
    for name, plan in (("even", even), ("greedy", greedy)):
        sizes = [sum(c for _, c in step) for step in plan]
        assert len(plan) == cdiv(total, budget), f"{name}: {len(plan)} steps for {total} tokens under {budget}"
        assert max(sizes) <= budget, f"{name}: a step of {max(sizes)} tokens over the budget {budget}"
        for i, n in enumerate(lengths):
            assert sum(c for step in plan for sid, c in step if sid == i) == n, f"{name}: sequence {i}"
    sizes = [sum(c for _, c in step) for step in even]
    assert max(sizes) - min(sizes) <= 1, f"even: step sizes {sizes}"
    assert all(sum(c for _, c in step) == budget for step in greedy[:-1]), "greedy: a step before the last not full"


def test_even_chunking_of_the_agentic_resume():
    """The agentic bench's resumed turn (64 sequences of 1 + 256 tokens under 16384): greedy leaves a step of 64
    tokens of one sequence; even cuts two steps of 8224."""
    even, greedy = _prefill_plan([257] * 64, 16384, "even"), _prefill_plan([257] * 64, 16384, "greedy")
    assert [sum(c for _, c in s) for s in greedy] == [16384, 64] and greedy[1] == [(63, 64)]
    assert [sum(c for _, c in s) for s in even] == [8224, 8224]


def test_even_chunking_counts_only_admissible_waiting_sequences():
    """With ``max_num_seqs`` below the queue the budget is set from the sequences a step can admit: prompts of 10,
    10 and 30 under a budget of 15 with 2 seats are 20 pending tokens, two steps of 10 (counting the third
    prompt too would give 50 pending and steps of 13). The third waits for a seat (no decode step runs here)."""
    plan = _prefill_plan([10, 10, 30], 15, "even", max_num_seqs=2)
    assert plan == [[(0, 10)], [(1, 10)]], plan
