"""Block accounting (MEM): delta growth, reservation of paused sequences, pool pressure, no leaks;
and the context limit."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from reference import ContextLimitError, SamplingParams, SequenceStateError

from _helpers import (examples, cdiv, check_pool_accounting, drive, rand_ids,
                      tiny_engine)


def _num_cached(eng, sid):
    s = eng.snapshot()["seqs"][sid]
    return s[2], len(s[1])


@settings(max_examples=examples(30))
@given(bs=st.sampled_from([1, 4, 8, 16]), prompt_len=st.integers(1, 40),
       obs=st.lists(st.integers(0, 50), min_size=1, max_size=4), max_tokens=st.integers(1, 6))
def test_resume_grows_block_table_by_delta_only(bs, prompt_len, obs, max_tokens):
    eng = tiny_engine(block_size=bs, num_blocks=cdiv(400, bs), max_model_len=400)
    sid = eng.rollout_add(rand_ids(random.Random(prompt_len), prompt_len),
                          SamplingParams(max_tokens=max_tokens, stop_token_ids=()))
    eng.rollout_run_turns()
    for k, n in enumerate(obs):
        before = eng.block_table(sid)
        free_before = set(eng.snapshot()["free"])
        cached, total = _num_cached(eng, sid)
        assert cached == total - 1, "a paused sequence caches everything but its pending token"
        assert len(before) == cdiv(cached, bs), f"paused table {len(before)} pages for {cached} cached tokens"
        eng.rollout_continue(sid, rand_ids(random.Random(k), n))
        assert eng.block_table(sid) == before, "rollout_continue must not touch the block table"
        out = eng.rollout_run_turns()[sid]
        assert out.prefilled_tokens == 1 + n
        after = eng.block_table(sid)
        cached, total = _num_cached(eng, sid)
        assert after[:len(before)] == before, f"resume changed the cached prefix's pages: {before} -> {after[:len(before)]}"
        assert set(after[len(before):]) <= free_before, "new pages must come from the free list"
        assert len(after) == cdiv(cached, bs), f"{len(after)} pages for {cached} cached tokens (block {bs})"
        assert eng.num_free_blocks == len(free_before) - (len(after) - len(before))
    eng.rollout_finish(sid)
    assert eng.num_free_blocks == eng.num_blocks
    assert sorted(eng.snapshot()["free"]) == list(range(eng.num_blocks))


def test_paused_sequences_hold_their_blocks():
    eng = tiny_engine(block_size=4, num_blocks=100)
    sp = SamplingParams(max_tokens=5, stop_token_ids=())
    paused = [eng.rollout_add(rand_ids(random.Random(i), 7 + 3 * i), sp) for i in range(3)]
    eng.rollout_run_turns()
    tables = {s: eng.block_table(s) for s in paused}
    assert all(eng.state(s) == "paused" for s in paused)
    held = sum(len(t) for t in tables.values())
    assert held > 0 and eng.num_free_blocks == eng.num_blocks - held, "paused blocks must be counted as used"
    # new work does not take the paused pages
    newer = [eng.rollout_add(rand_ids(random.Random(10 + i), 20), sp) for i in range(3)]
    eng.rollout_run_turns()
    for s in paused:
        assert eng.block_table(s) == tables[s], "a paused table changed while the pool had room"
    new_pages = {p for s in newer for p in eng.block_table(s)}
    assert not new_pages & {p for t in tables.values() for p in t}
    check_pool_accounting(eng)
    # a waiting (continued, not yet run) sequence still holds its pages
    eng.rollout_continue(paused[0], [1, 2, 3])
    assert eng.state(paused[0]) == "waiting" and eng.block_table(paused[0]) == tables[paused[0]]
    check_pool_accounting(eng)
    for s in paused + newer:
        eng.rollout_finish(s)
    assert eng.num_free_blocks == eng.num_blocks


def test_finish_frees_every_block_in_every_state():
    eng = tiny_engine(block_size=4, num_blocks=60, max_model_len=40)
    sp = SamplingParams(max_tokens=4, stop_token_ids=())
    a = eng.rollout_add(list(range(1, 12)), sp)                       # paused
    b = eng.rollout_add(list(range(20, 30)), sp)                      # continued -> waiting with pages
    c = eng.rollout_add(list(range(3, 40)), sp)                       # reaches the context limit
    eng.rollout_run_turns()
    eng.rollout_continue(b, [5, 6])
    d = eng.rollout_add([9, 9, 9], sp)                                # waiting, never run
    e = eng.rollout_add([4, 5, 6, 7, 8], SamplingParams(max_tokens=30, stop_token_ids=()))
    eng.generate([[1, 2]], SamplingParams(max_tokens=1, stop_token_ids=()))   # leaves e (and b) mid-turn
    states = {s: eng.state(s) for s in (a, b, c, d, e)}
    assert states[a] == "paused" and states[c] == "finished" and states[e] == "running", states
    assert eng.num_free_blocks < eng.num_blocks
    for s in (a, b, c, d, e):
        eng.rollout_finish(s)
        check_pool_accounting(eng)
    assert eng.num_free_blocks == eng.num_blocks
    assert sorted(eng.snapshot()["free"]) == list(range(eng.num_blocks)), "a page leaked"
    assert eng.snapshot()["seqs"] == {}


def _pressure_specs(n, seed, sampled=False):
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        sp = (SamplingParams(temperature=0.9, top_k=40, max_tokens=4, stop_token_ids=(), seed=i) if sampled
              else SamplingParams(max_tokens=4, stop_token_ids=()))
        specs.append((rand_ids(rng, 5 + i % 4), sp))
    return specs


@pytest.mark.parametrize("sampled,swap", [(False, 0), (True, 0), (False, 6), (True, 40)])
def test_pool_pressure_matches_big_pool(sampled, swap):
    """12 pages of 4 tokens for 6 sequences of up to 48 tokens: paused KV gets evicted (dropped and
    recomputed, or swapped to host memory when ``swap_space`` allows), running sequences get
    preempted, and every trajectory equals the big-pool run."""
    specs = _pressure_specs(6, 1, sampled)
    obs_fn = lambda i, k, t: rand_ids(random.Random(i * 13 + k), (i + 3 * k) % 9)  # noqa: E731
    small = tiny_engine(block_size=4, num_blocks=12, max_model_len=48, swap_space=swap)
    big = tiny_engine(block_size=4, num_blocks=400, max_model_len=48)
    assert small.max_model_len == big.max_model_len == 48
    a = drive(small, specs, 4, obs_fn, check_pool=check_pool_accounting)
    b = drive(big, specs, 4, obs_fn)
    if swap:
        assert small.scheduler.swaps > 0, "the test did not swap paused KV out"
    if swap < 40:
        assert small.scheduler.evictions > 0, "the test did not force paused-KV eviction"
    assert small.scheduler.preemptions > 0, "the test did not force preemption of running sequences"
    assert big.scheduler.evictions == big.scheduler.preemptions == 0
    for ra, rb in zip(a, b):
        assert ra.trajectory.token_ids == rb.trajectory.token_ids, f"seq {ra.sid}: tiny pool changed the tokens"
        assert ra.trajectory.assistant_mask == rb.trajectory.assistant_mask
        assert [o.stop_reason for o in ra.outputs] == [o.stop_reason for o in rb.outputs]
        d = max(abs(x - y) for x, y in zip(ra.trajectory.logprobs, rb.trajectory.logprobs))
        assert d <= 1e-5, f"seq {ra.sid}: logprobs differ by {d:.2e} after recompute"
    assert small.num_free_blocks == small.num_blocks, "blocks leaked under pressure"
    assert sorted(small.snapshot()["free"]) == list(range(12))
    assert small.scheduler.swap_used == 0 and not small.runner.host, "host swap space leaked"


@settings(max_examples=examples(30))
@given(num_blocks=st.integers(4, 14), n_seqs=st.integers(2, 7), seed=st.integers(0, 10_000),
       budget=st.sampled_from([3, 8, 2048]), max_seqs=st.sampled_from([2, 64]), swap=st.sampled_from([0, 0, 3, 50]))
def test_pool_pressure_random(num_blocks, n_seqs, seed, budget, max_seqs, swap):
    bs = 4
    mml = min(num_blocks * bs, 36)
    rng = random.Random(seed)
    specs = [(rand_ids(rng, rng.randint(1, 10)), SamplingParams(max_tokens=rng.randint(1, 5), stop_token_ids=()))
             for _ in range(n_seqs)]
    obs = {(i, k): rng.randint(0, 9) for i in range(n_seqs) for k in range(4)}
    obs_fn = lambda i, k, t: rand_ids(random.Random(i * 7 + k), obs[(i, k)])  # noqa: E731
    small = tiny_engine(block_size=bs, num_blocks=num_blocks, max_model_len=mml, max_num_batched_tokens=budget,
                        max_num_seqs=max_seqs, swap_space=swap)
    big = tiny_engine(block_size=bs, num_blocks=500, max_model_len=mml)
    a = drive(small, specs, 4, obs_fn, check_pool=check_pool_accounting)
    b = drive(big, specs, 4, obs_fn)
    for ra, rb in zip(a, b):
        assert ra.trajectory.token_ids == rb.trajectory.token_ids
    assert small.num_free_blocks == small.num_blocks
    assert small.scheduler.swap_used == 0


# ----------------------------------------------------------------------------- context limit

def test_context_limit_finishes_and_frees():
    eng = tiny_engine(block_size=4, num_blocks=40, max_model_len=24)
    assert eng.max_model_len == 24
    sp = SamplingParams(max_tokens=50, stop_token_ids=())
    sid = eng.rollout_add(list(range(1, 21)), sp)
    other = eng.rollout_add(list(range(1, 5)), SamplingParams(max_tokens=3, stop_token_ids=()))
    outs = eng.rollout_run_turns()
    out = outs[sid]
    assert out.stop_reason == "context_limit" and out.finished, out
    assert len(out.token_ids) == 4, "a 20-token prompt under a 24-token limit gets 4 tokens"
    assert eng.state(sid) == "finished"
    assert eng.block_table(sid) == [], "a sequence finished by the context limit must free its blocks"
    assert outs[other].stop_reason == "max_tokens" and eng.state(other) == "paused"
    assert eng.num_free_blocks == eng.num_blocks - len(eng.block_table(other))
    snap = eng.snapshot()
    with pytest.raises(SequenceStateError):
        eng.rollout_continue(sid, [1])
    with pytest.raises(SequenceStateError):
        eng.rollout_continue(sid, [])
    assert eng.snapshot() == snap
    traj = eng.rollout_finish(sid)
    assert traj.stop_reason == "context_limit" and traj.num_turns == 1
    assert len(traj.token_ids) == 24 and traj.token_ids[:20] == list(range(1, 21))
    assert traj.token_ids[20:] == out.token_ids and traj.assistant_mask[20:] == [1] * 4
    # the oracle agrees on tokens and reason
    from reference.oracle import oracle_generate
    o = oracle_generate(eng.model, list(range(1, 21)), sp, 24)
    assert o.token_ids == out.token_ids and o.stop_reason == "context_limit"


def test_context_limit_in_a_later_turn_and_exact_fit():
    eng = tiny_engine(block_size=4, num_blocks=40, max_model_len=30)
    sid = eng.rollout_add(list(range(1, 9)), SamplingParams(max_tokens=3, stop_token_ids=()))
    eng.rollout_run_turns()                                          # 11 tokens
    with pytest.raises(ContextLimitError):
        eng.rollout_continue(sid, list(range(19)))                   # 11 + 19 + 1 > 30
    eng.rollout_continue(sid, list(range(18)))                       # 11 + 18 = 29: room for exactly one token
    out = eng.rollout_run_turns()[sid]
    assert out.token_ids and len(out.token_ids) == 1 and out.stop_reason == "context_limit" and out.finished
    assert eng.num_free_blocks == eng.num_blocks
    traj = eng.rollout_finish(sid)
    assert len(traj.token_ids) == 30 and traj.num_turns == 2


def test_generate_stops_at_context_limit_and_prompt_limits():
    eng = tiny_engine(block_size=4, num_blocks=40, max_model_len=16)
    toks = eng.generate([list(range(1, 13)), [3]], SamplingParams(max_tokens=100, stop_token_ids=()))
    assert len(toks[0]) == 4 and len(toks[1]) == 15
    eng.generate([list(range(15))], SamplingParams(max_tokens=5, stop_token_ids=()))   # 15 + 1 == 16 fits
    with pytest.raises(ContextLimitError):
        eng.generate([list(range(16))], SamplingParams(max_tokens=5, stop_token_ids=()))
    assert eng.num_free_blocks == eng.num_blocks


def test_pool_bounds_max_model_len():
    eng = tiny_engine(block_size=4, num_blocks=5, max_model_len=None)
    assert eng.max_model_len == 20, "a single sequence must always fit the pool"
    with pytest.raises(ContextLimitError):
        eng.rollout_add(list(range(20)))
    sid = eng.rollout_add(list(range(19)), SamplingParams(max_tokens=9, stop_token_ids=()))
    assert eng.rollout_run_turns()[sid].stop_reason == "context_limit"
