"""Issue 9 on the reference: memory pressure (swap and recompute), weight updates, abort,
group prefix sharing with copy-on-write, trajectory export."""

from __future__ import annotations

import json
import random

import pytest
import torch

import reference
from reference.weights import random_weights

from _helpers import TINY, tiny_weights

GREEDY = reference.SamplingParams(max_tokens=6, stop_token_ids=())


def _engine(**kw) -> reference.Engine:
    kw.setdefault("block_size", 4)
    kw.setdefault("max_model_len", 128)
    kw.setdefault("num_blocks", 256)
    return reference.Engine.from_state_dict(TINY, tiny_weights(0), **kw)


def _rollout(eng: reference.Engine, prompts: list[list[int]], turns: int, obs_len: int, sps=None) -> list:
    sps = sps or [GREEDY] * len(prompts)
    sids = [eng.rollout_add(p, sp) for p, sp in zip(prompts, sps)]
    for t in range(turns):
        outs = eng.rollout_run_turns()
        assert set(outs) == set(sids), f"turn {t}: every sequence ends its turn"
        if t + 1 < turns:
            for s in sids:
                eng.rollout_continue(s, [(s * 7 + t * 3 + i) % 512 for i in range(obs_len)])
    trajs = [eng.rollout_finish(s) for s in sids]
    assert eng.num_free_blocks == eng.num_blocks, "blocks leaked"
    return trajs


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(rng.randrange(5, 30))] for _ in range(n)]


@pytest.mark.parametrize("swap_space", [0, 8, 1000])
def test_pool_far_smaller_than_workload(swap_space):
    prompts = _prompts(6)
    big = _rollout(_engine(), prompts, turns=3, obs_len=9)
    small_eng = _engine(num_blocks=24, swap_space=swap_space)       # 6 sequences of ~60 tokens need ~90 blocks
    small = _rollout(small_eng, prompts, turns=3, obs_len=9)
    assert [t.token_ids for t in small] == [t.token_ids for t in big], "memory pressure changed the tokens"
    sched = small_eng.scheduler
    assert sched.swaps + sched.evictions + sched.preemptions > 0, "the small pool was never under pressure"
    if swap_space >= 1000:
        assert sched.swaps > 0 and sched.evictions == 0, "with ample swap space, paused KV is swapped, not dropped"
    if swap_space == 0:
        assert sched.swaps == 0
    assert sched.swap_used == 0 and not small_eng.runner.host, "host copies leaked"


def test_swapped_kv_restored_bitwise():
    eng = _engine(num_blocks=12, swap_space=100)
    eng.record_logits()
    a = eng.rollout_add(list(range(1, 30)), GREEDY)
    eng.rollout_run_turns()                                          # a pauses holding 9 of 12 blocks
    b = eng.rollout_add(list(range(100, 130)), GREEDY)
    eng.rollout_run_turns()                                          # b needs the pool: a is swapped out
    assert eng.scheduler.swaps >= 1 and eng._seqs[a].swapped > 0
    eng.rollout_finish(b)
    eng.rollout_continue(a, [5, 6, 7])
    out = eng.rollout_run_turns()[a]
    assert out.prefilled_tokens == 4, "swap-in restores the KV: only [pending] + observation are prefilled"
    ref = _engine()
    ref.record_logits()
    r = ref.rollout_add(list(range(1, 30)), GREEDY)
    ref.rollout_run_turns()
    ref.rollout_continue(r, [5, 6, 7])
    assert ref.rollout_run_turns()[r].token_ids == out.token_ids
    assert torch.equal(torch.stack(ref.logit_log[r]), torch.stack(eng.logit_log[a])), "swapped KV not restored exactly"


def test_abort_returns_partial_turn_and_can_continue():
    eng = _engine()
    sid = eng.rollout_add([1, 2, 3, 4, 5], reference.SamplingParams(max_tokens=20, stop_token_ids=()))
    assert eng.rollout_run_turns(max_steps=4) == {}
    assert eng.state(sid) == "running"
    out = eng.abort(sid)
    assert out.stop_reason == "aborted" and len(out.token_ids) == 4
    assert eng.state(sid) == "paused"
    before = eng.snapshot()
    with pytest.raises(reference.SequenceStateError):
        eng.abort(sid)                                               # no open turn
    assert eng.snapshot() == before
    eng.rollout_continue(sid, [9, 9])
    nxt = eng.rollout_run_turns()[sid]
    ctx = [1, 2, 3, 4, 5] + out.token_ids + [9, 9]
    assert nxt.token_ids == eng.generate([ctx], reference.SamplingParams(max_tokens=20, stop_token_ids=()))[0]
    tr = eng.rollout_finish(sid)
    assert tr.num_turns == 2 and eng.num_free_blocks == eng.num_blocks


def test_update_weights_keeps_or_recomputes_kv():
    new = random_weights(TINY, seed=1)
    for recompute in (False, True):
        eng = _engine()
        sid = eng.rollout_add(list(range(3, 20)), GREEDY)
        first = eng.rollout_run_turns()[sid]
        assert first.weights_version == 0
        with pytest.raises(reference.ConfigError):
            eng.update_weights({k: v for k, v in new.items() if "q_proj" not in k})
        assert eng.weights_version == 0, "a rejected update changed the version"
        assert eng.update_weights(new, recompute_kv=recompute) == 1
        eng.rollout_continue(sid, [7, 8])
        second = eng.rollout_run_turns()[sid]
        assert second.weights_version == 1
        fresh = reference.Engine.from_state_dict(TINY, new, block_size=4, max_model_len=128, num_blocks=256)
        ctx = list(range(3, 20)) + first.token_ids + [7, 8]
        if recompute:   # the whole context recomputed under the new weights: equals a fresh engine
            assert second.prefilled_tokens == len(ctx)
            assert second.token_ids == fresh.generate([ctx], GREEDY)[0]
        else:           # stale KV kept: only [pending] + observation prefilled
            assert second.prefilled_tokens == 3
        tr = eng.rollout_finish(sid)
        versions = [v for v, m in zip(tr.weights_versions, tr.assistant_mask) if m]
        assert versions == [0] * len(first.token_ids) + [1] * len(second.token_ids)
        assert all(v == -1 for v, m in zip(tr.weights_versions, tr.assistant_mask) if not m)


@pytest.mark.parametrize("prompt_len", [16, 19])      # ends on a block boundary (copy-on-write) / mid-block
@pytest.mark.parametrize("n", [4, 8])
def test_group_prefix_sharing(prompt_len, n):
    prompt = [(i * 37) % 512 for i in range(prompt_len)]
    sps = [reference.SamplingParams(temperature=0.9, top_p=0.95, max_tokens=6, stop_token_ids=(), seed=s) for s in range(n)]
    shared = _engine()
    sids = shared.rollout_add_group(prompt, sps)
    outs = shared.rollout_run_turns()
    full_blocks = prompt_len // 4
    # every follower holds the leader's full prompt blocks until it writes
    prefilled = sum(outs[s].prefilled_tokens for s in sids)
    assert prefilled == prompt_len + (n - 1) * (prompt_len - min(full_blocks * 4, prompt_len - 1))
    plain = _engine()
    psids = [plain.rollout_add(prompt, sp) for sp in sps]
    pouts = plain.rollout_run_turns()
    assert [outs[s].token_ids for s in sids] == [pouts[s].token_ids for s in psids], "sharing changed the samples"
    used_shared = shared.num_blocks - shared.num_free_blocks
    used_plain = plain.num_blocks - plain.num_free_blocks
    saved = used_plain - used_shared
    expect_saved = (n - 1) * (full_blocks - (1 if prompt_len % 4 == 0 else 0))
    assert saved == expect_saved, f"blocks saved {saved}, expected {expect_saved}"
    for s in sids:
        shared.rollout_continue(s, [1, 2, 3])
    outs2 = shared.rollout_run_turns()
    for p in psids:
        plain.rollout_continue(p, [1, 2, 3])
    pouts2 = plain.rollout_run_turns()
    assert [outs2[s].token_ids for s in sids] == [pouts2[s].token_ids for s in psids]
    for s in sids:
        shared.rollout_finish(s)
    assert shared.num_free_blocks == shared.num_blocks, "a shared block leaked (reference count)"


@pytest.mark.parametrize("chunking", ["even", "greedy"])
@pytest.mark.parametrize("end", ["continue", "finish"])
def test_a_held_group_member_aborted_leaves_its_leader(chunking, end):
    """A group member aborted while still held for its leader's prompt KV is no longer the leader's: continued,
    it is queued once and prefills its own context (its tokens are ``generate``'s over that context); finished,
    it is gone. One seat (``max_num_seqs=1``), so the leader's release comes while the member waits in the queue:
    before the fix it was queued a second time (found by the stateful test once prefills were cut evenly)."""
    from reference.sequence import SeqState

    prompt = [(i * 29) % 512 for i in range(12)]
    eng = _engine(max_num_batched_tokens=5, max_num_seqs=1, prefill_chunking=chunking)
    lead, held, other = eng.rollout_add_group(prompt, [GREEDY] * 3)
    aborted = eng.abort(held)
    assert aborted.stop_reason == "aborted" and aborted.token_ids == [] and eng.state(held) == "paused"
    if end == "continue":
        eng.rollout_continue(held, [7, 8])
    else:
        eng.rollout_finish(held)
    sch = eng.scheduler
    while sch.has_work():
        eng._step()
        for s in eng._seqs.values():
            where = [any(q is s for q in sch.waiting), any(q is s for q in sch.running), any(q is s for q in sch.paused)]
            assert sum(where) <= 1, f"sequence {s.seq_id} in {where}"
            assert s.state != SeqState.RUNNING or where[1]
    outs = eng._outbox
    want = _engine().generate([prompt], GREEDY)[0]
    assert outs[lead].token_ids == want and outs[other].token_ids == want
    if end == "continue":
        assert outs[held].token_ids == _engine().generate([prompt + [7, 8]], GREEDY)[0]
        assert outs[held].prefilled_tokens == len(prompt) + 2        # its own context: nothing shared
        eng.rollout_finish(held)
    else:
        assert held not in outs
    eng.rollout_finish(lead)
    eng.rollout_finish(other)
    assert eng.num_free_blocks == eng.num_blocks, "a page leaked"


def test_copy_on_write_block_manager():
    from reference.kv_cache import BlockManager
    bm = BlockManager(8, 4)
    a: list[int] = []
    bm.grow(a, 8)                                                    # two pages
    b = bm.share(a)
    assert [bm.refcount(p) for p in a] == [2, 2]
    copies = bm.copy_on_write(b, 7, 8)                               # writing position 7 (page 1) of b
    assert len(copies) == 1 and copies[0][0] == a[1] and b[1] != a[1] and b[0] == a[0]
    assert bm.refcount(a[1]) == 1 and bm.refcount(b[1]) == 1
    bm.free(a)
    bm.free(b)
    assert bm.num_free == 8


def test_trajectory_export_jsonl_and_verl():
    eng = _engine()
    sid = eng.rollout_add([1, 2, 3], GREEDY)
    out = eng.rollout_run_turns()[sid]
    eng.rollout_continue(sid, [4, 5])
    eng.rollout_run_turns()
    tr = eng.rollout_finish(sid)
    line = json.loads(json.dumps(tr.to_dict()))
    assert line["token_ids"] == tr.token_ids and line["spans"][0] == {"kind": "prompt", "start": 0, "end": 3}
    v = tr.to_verl()
    assert v["prompt_ids"] == [1, 2, 3]
    assert v["response_ids"][:len(out.token_ids)] == out.token_ids
    assert len(v["response_ids"]) == len(v["response_mask"]) == len(v["response_logprobs"])
    assert sum(v["response_mask"]) == 12 and v["num_turns"] == 2
