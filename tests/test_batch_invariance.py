"""Issue 6 on the reference: batch-invariant mode (bitwise), guards under fuzzing, the
context-parallel merge, fused RoPE, and the dry-run planner."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import reference
from reference import attention
from reference.attention import PartialState
from reference.plan import main as plan_main

from _helpers import TINY, rope_rollout, target_logits, tiny_weights


def _engine(**kw) -> reference.Engine:
    kw.setdefault("block_size", 4)
    kw.setdefault("num_blocks", 256)
    kw.setdefault("max_model_len", 256)
    return reference.Engine.from_state_dict(TINY, tiny_weights(0), **kw)


@pytest.mark.parametrize("split_kv", ["fixed:3", "fixed:16", "disabled"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_invariant_bitwise_across_batch_mates_and_turn_splits(split_kv, dtype):
    rng = random.Random(7)
    target = [rng.randrange(512) for _ in range(13)]
    obs = [rng.randrange(512) for _ in range(9)]
    alone, toks_alone, ctx = target_logits(_engine(split_kv=split_kv, dtype=dtype, batch_invariant=True), target, [], obs, True)
    for n, first in ((3, True), (6, False)):
        mates = [[rng.randrange(512) for _ in range(rng.randrange(1, 40))] for _ in range(n)]
        crowd, toks_crowd, _ = target_logits(_engine(split_kv=split_kv, dtype=dtype, batch_invariant=True),
                                               target, mates, obs, first)
        assert toks_crowd == toks_alone, "INVARIANT: tokens changed with batch mates"
        assert torch.equal(crowd, alone), (f"INVARIANT: logits not bitwise equal with {n} batch mates "
                                           f"(max diff {(crowd - alone).abs().max().item():.3g})")
    single = _engine(split_kv=split_kv, dtype=dtype, batch_invariant=True)
    single.record_logits()
    single.generate([ctx], reference.SamplingParams(max_tokens=5, stop_token_ids=()))
    one_shot = torch.stack(single.logit_log[0])
    assert torch.equal(alone[5:], one_shot), "INVARIANT: multi-turn resume differs from single-shot prefill"


def test_invariant_rejects_auto_split():
    with pytest.raises(reference.ConfigError, match="batch-invariant"):
        _engine(split_kv="auto", batch_invariant=True)


def test_split_policy_recorded_in_turn_output():
    for policy, expect in (("fixed:7", 7), ("disabled", None)):
        eng = _engine(split_kv=policy)
        sid = eng.rollout_add([1, 2, 3, 4, 5], reference.SamplingParams(max_tokens=4, stop_token_ids=()))
        out = eng.rollout_run_turns()[sid]
        assert out.split_kv == policy
        assert out.split_sizes == [expect] * 3, out.split_sizes   # 3 decode steps after the prefill sample


# ----------------------------------------------------------------------------- guards, fuzzed

@given(st.data())
def test_guards_reject_every_malformed_table(data):
    bs = data.draw(st.sampled_from([1, 4, 16]))
    num_blocks = data.draw(st.integers(4, 40))
    B = data.draw(st.integers(1, 4))
    lens = [data.draw(st.integers(0, 3 * bs)) for _ in range(B)]
    free = list(range(num_blocks))
    random.Random(data.draw(st.integers(0, 2**16))).shuffle(free)
    tables = []
    for n in lens:
        k = -(-n // bs)
        tables.append([free.pop() for _ in range(k)] if len(free) >= k else None)
    if any(t is None for t in tables):
        return
    width = max([len(t) for t in tables] + [1]) + 1
    bt = torch.full((B, width), -1, dtype=torch.long)
    for b, t in enumerate(tables):
        bt[b, :len(t)] = torch.tensor(t, dtype=torch.long)
    seq_lens = torch.tensor(lens)
    attention.check_block_tables(bt, seq_lens, num_blocks, bs)      # the well-formed table passes
    mutation = data.draw(st.sampled_from(["out_of_range", "negative", "short", "trailing", "duplicate", "neg_len"]))
    bad_bt, bad_lens = bt.clone(), seq_lens.clone()
    used = [(b, j) for b in range(B) for j in range(len(tables[b]))]
    if mutation in ("out_of_range", "negative", "trailing", "duplicate") and not used and mutation != "trailing":
        return
    if mutation == "out_of_range":
        b, j = data.draw(st.sampled_from(used))
        bad_bt[b, j] = num_blocks + data.draw(st.integers(0, 5))
    elif mutation == "negative":
        b, j = data.draw(st.sampled_from(used))
        bad_bt[b, j] = -1 - data.draw(st.integers(0, 5))
    elif mutation == "short":
        b = data.draw(st.integers(0, B - 1))
        bad_lens[b] = (len(tables[b]) + 1) * bs if len(tables[b]) + 1 <= width else width * bs + 1
        if len(tables[b]) + 1 <= width:
            bad_bt[b, len(tables[b])] = -1
    elif mutation == "trailing":
        b = data.draw(st.integers(0, B - 1))
        bad_bt[b, width - 1] = 0
    elif mutation == "duplicate":                                  # twice within one table
        multi = [b for b in range(B) if len(tables[b]) >= 2]
        if not multi:
            return
        b = data.draw(st.sampled_from(multi))
        bad_bt[b, len(tables[b]) - 1] = bad_bt[b, 0]
    else:
        bad_lens[0] = -1
    with pytest.raises(reference.BlockTableError):
        attention.check_block_tables(bad_bt, bad_lens, num_blocks, bs)


def test_query_position_guard():
    lens = torch.tensor([5, 9])
    attention.check_query_positions(torch.tensor([0, 1, 1]), torch.tensor([4, 8, -1]), lens)
    with pytest.raises(reference.BlockTableError):
        attention.check_query_positions(torch.tensor([0]), torch.tensor([5]), lens)
    with pytest.raises(reference.BlockTableError):
        attention.check_query_positions(torch.tensor([2]), torch.tensor([0]), lens)


# ----------------------------------------------------------------------------- context-parallel merge

@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_cp_merge_equals_full_attention(shards, seed):
    g = torch.Generator().manual_seed(seed * 100 + shards)
    bs, n_blocks, n_q, n_kv, D = 4, 12, 4, 2, 16
    L = n_blocks * bs - 3
    k_cache = torch.randn(n_blocks, bs, n_kv, D, generator=g)
    v_cache = torch.randn(n_blocks, bs, n_kv, D, generator=g)
    q = torch.randn(1, n_q, D, generator=g)
    table = torch.randperm(n_blocks, generator=g)[None, :]
    full = attention.split_kv_decode(q, k_cache, v_cache, table, torch.tensor([L]), None)
    owner = torch.randint(0, shards, (n_blocks,), generator=g)     # random block ownership
    states = []
    for j in range(-(-L // bs)):                                   # one partial state per owned block
        o, lse = attention.split_kv_partials(q, k_cache, v_cache, table, torch.tensor([L]), bs)
        states.append(PartialState(o[0, j], lse[0, j], global_block_index=j))
    by_rank = [[s for s in states if int(owner[s.global_block_index]) == r] for r in range(shards)]
    gathered = [s for r in reversed(range(shards)) for s in by_rank[r]]   # arrival order scrambled
    o, lse = attention.merge_states(gathered)
    assert torch.allclose(o, full[0].float(), atol=1e-5, rtol=1e-5), (o - full[0]).abs().max()
    assert torch.isfinite(lse).all()
    o2, _ = attention.merge_states(list(reversed(gathered)))
    assert torch.equal(o, o2), "merge result depends on arrival order"


def test_cp_merge_rejects_duplicates_and_empty():
    s = PartialState(torch.zeros(2, 4), torch.zeros(2), 3)
    with pytest.raises(reference.MergeError):
        attention.merge_states([s, PartialState(torch.zeros(2, 4), torch.zeros(2), 3)])
    with pytest.raises(reference.MergeError):
        attention.merge_states([])
    empty = PartialState(torch.zeros(2, 4), torch.full((2,), float("-inf")), 0)
    o, lse = attention.merge_states([empty, PartialState(torch.zeros(2, 4), torch.full((2,), float("-inf")), 1)])
    assert torch.equal(o, torch.zeros(2, 4)) and torch.isinf(lse).all(), "all-empty merge must be o=0, lse=-inf"


# ----------------------------------------------------------------------------- fused RoPE

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_rope_equals_unfused(dtype):
    runs = []
    for fused in (False, True):
        eng = _engine(rope_in_attention=fused, dtype=dtype, split_kv="fixed:5")
        runs.append((*rope_rollout(eng), eng.score(list(range(50)))))
    (t0, l0, s0), (t1, l1, s1) = runs
    print(f"fused vs unfused RoPE ({dtype}): max logit diff {(l0 - l1).abs().max().item():.3g}")
    assert t0 == t1
    # the reference rotates the same float32 values either way, so the LOGIT rule's bound (2x a zero error) is 0
    assert torch.equal(l0, l1) and torch.equal(s0, s1)


# ----------------------------------------------------------------------------- dry-run planner

def test_plan_prints_splits_ownership_and_guards(capsys):
    assert plan_main(["--lens", "17,33,0", "--block-size", "8", "--split-kv", "fixed:16", "--cp", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split_kv"] == "fixed:16" and out["guards"]["ok"]
    assert [len(s["splits"]) for s in out["sequences"]] == [2, 3, 0]
    assert out["sequences"][1]["cp_owner"] == {"0": 0, "1": 1, "2": 0, "3": 1, "4": 0}
    assert plan_main(["--lens", "17", "--block-size", "8", "--num-blocks", "4", "--table", "[[0, 1, 9]]"]) == 1
    assert json.loads(capsys.readouterr().out)["guards"]["error"] == "BlockTableError"
