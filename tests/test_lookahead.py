"""One decode step of lookahead (``optimized/lookahead.py``) on the CPU, with the stand-in kernels of
``test_optimized_host``: the engine must behave exactly as without it -- the same tokens, logprobs,
stop reasons and host state after every call -- across stop tokens, page boundaries, shared pages,
length limits, memory pressure, early exits, aborts, scoring and weight updates; and a foretold step
must be the scheduler's real next step whenever every sequence went on."""

from __future__ import annotations

import pytest

import reference
from reference.weights import random_weights

from _helpers import TINY

STOPS = tuple(range(0, 512, 9))          # ~11% of the vocabulary: turns end at scattered steps


def _sp(seed: int, max_tokens: int) -> reference.SamplingParams:
    return reference.SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, stop_token_ids=STOPS)


def _record(eng, log: list, out) -> None:
    """Append what a call returned and the engine's host state after it."""
    if isinstance(out, dict):
        out = {sid: (o.token_ids, o.logprobs, o.stop_reason, o.turn_index) for sid, o in sorted(out.items())}
    log.append((out, eng.snapshot(), eng.num_free_blocks))


def _workload(eng) -> list:
    """Multi-turn rollouts with stop tokens, a group with shared prompt pages, a context limit, an
    early exit, an abort, a score and a weight update; the record of every call."""
    log: list = []
    sids = [eng.rollout_add([(5 * i + j) % 512 for j in range(3 + 4 * i)], _sp(i, 6 + 3 * i)) for i in range(4)]
    sids += eng.rollout_add_group(list(range(8)), [_sp(10 + i, 9) for i in range(2)])   # block-aligned: shared pages
    sids.append(eng.rollout_add([(3 * j) % 512 for j in range(50)], reference.SamplingParams(
        temperature=1.0, seed=99, max_tokens=40, stop_token_ids=())))                    # ends at max_model_len
    _record(eng, log, eng.rollout_run_turns(max_steps=3))                               # early exit mid-turn
    _record(eng, log, eng.rollout_run_turns())
    for turn in range(3):
        for sid in sids:
            if eng.state(sid) == "paused":
                eng.rollout_continue(sid, [(sid * 7 + turn + k) % 512 for k in range(1 + (sid + turn) % 5)])
        if turn == 1:
            _record(eng, log, eng.rollout_run_turns(max_steps=2))
            live = [s for s in sids if eng.state(s) in ("running", "waiting")]
            if live:
                _record(eng, log, eng.abort(live[0]).token_ids)
            _record(eng, log, eng.score(list(range(20))).sum().item())
            eng.update_weights(random_weights(TINY, seed=7))
        _record(eng, log, eng.rollout_run_turns())
    for sid in sids:
        if eng.state(sid) != "finished" or sid in eng._seqs:
            _record(eng, log, eng.rollout_finish(sid).token_ids)
    _record(eng, log, eng.generate([[1, 2, 3], [4, 5, 6, 7, 8]], _sp(3, 10)))
    return log


def _pair(opt_engine, **kw):
    on, off = opt_engine(**kw), opt_engine(**kw)
    off.runner.lookahead = False
    return on, off


@pytest.mark.parametrize("kw", [dict(block_size=4, max_model_len=64),
                                dict(block_size=4, max_model_len=64, num_blocks=24, swap_space=12),
                                dict(block_size=8, max_model_len=64, batch_invariant=True, split_kv="fixed:8")],
                         ids=["pages", "pressure", "invariant"])
def test_lookahead_changes_nothing(opt_engine, kw):
    on, off = _pair(opt_engine, **kw)
    got, want = _workload(on), _workload(off)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"call {i}: the engine with lookahead differs from the one without"
    r = on.runner
    print(f"lookahead steps used {r.lookahead_used}, dropped {r.lookahead_dropped}")
    assert r.lookahead_used > 0, "no foretold step was ever used: the test does not exercise the lookahead"
    assert r.lookahead_dropped > 0, "no foretold step was ever dropped: stop tokens did not exercise the check"
    assert off.runner.lookahead_used == off.runner.lookahead_dropped == 0
    assert r._ahead is None, "a lookahead step outlived its run loop"


def _slots(runner) -> list[dict]:
    return [slot for g in runner.graphs.values() for slot in g["slots"]]


@pytest.mark.parametrize("two", [True, False], ids=["two-slots", "one-slot"])
def test_the_decode_graphs_hand_off_their_tokens_as_the_next_ids(opt_engine, two):
    """``decode_handoff``: a decode graph samples into one buffer (tokens | logprob bits) that is also the
    input ids of the graph fed by it -- its own with one slot, the other slot's with two
    (``decode_copy_stream``) -- read back with one copy; a foretold step of the same graph key copies no ids,
    and a step from the host or from another graph key copies them into that buffer. The workload's record
    is the same as with the ids uploaded and copied (``decode_handoff=False``)."""
    kw = dict(block_size=4, max_model_len=64)
    on, off = opt_engine(**kw), opt_engine(**kw)
    on.runner.decode_copy_stream = off.runner.decode_copy_stream = two
    off.runner.decode_handoff = False
    copies: list = []
    orig = on.runner._launch_decode

    def spy(batch, ids_from=None):
        run = orig(batch, ids_from)
        slot = next(s for s in _slots(on.runner) if s["toks"].data_ptr() == run["toks"].data_ptr())
        copies.append(ids_from is not None and ids_from["toks"].data_ptr() == slot["ids"].data_ptr())
        return run

    on.runner._launch_decode = spy
    assert _workload(on) == _workload(off)
    for g in on.runner.graphs.values():
        slots = g["slots"]
        assert g["handoff"] and len(slots) == (2 if two else 1)
        for j, slot in enumerate(slots):
            feeder = slots[(j + 1) % len(slots)]
            assert slot["ids"].data_ptr() == feeder["both"].data_ptr() == feeder["toks"].data_ptr()
    assert all(not g["handoff"] and len(g["slots"]) == (2 if two else 1) for g in off.runner.graphs.values())
    assert any(copies) and not all(copies), "no foretold step of the same graph key, or every step was one"


def test_two_slots_change_nothing(opt_engine):
    """``decode_copy_stream``: two device slots per decode graph key, used in turn, give the record of one
    slot, with and without the hand-off."""
    kw = dict(block_size=4, max_model_len=64)
    for handoff in (True, False):
        two, one = opt_engine(**kw), opt_engine(**kw)
        one.runner.decode_copy_stream = False
        two.runner.decode_handoff = one.runner.decode_handoff = handoff
        assert _workload(two) == _workload(one)
        used = {id(s) for s in _slots(two.runner) if s.get("toks") is not None}
        assert len(used) == len(_slots(two.runner)) and len(used) % 2 == 0, "a slot was never used"


def test_a_used_lookahead_keeps_no_chain_of_launches(opt_engine):
    """Each launched step refers to the one whose tokens it was fed only until it is checked: a long
    decode keeps at most the current launch and its foretold successor alive."""
    eng = opt_engine(block_size=4, max_model_len=128)
    seen: list = []
    orig = eng.runner._collect

    def spy(run):
        seen.append(run)
        return orig(run)

    eng.runner._collect = spy
    eng.generate([[1, 2, 3]], reference.SamplingParams(max_tokens=40, stop_token_ids=()))
    assert eng.runner.lookahead_used > 20
    assert all("src" not in run for run in seen[:-1]), "a used launch still refers to its predecessor"


def test_a_foretold_step_is_the_real_next_step_when_every_sequence_goes_on(opt_engine):
    """Whenever the next decode step has the same sequences as the last one, the prediction made
    during the last one equals it (``same_step``), page numbers included."""
    from optimized.lookahead import next_decode, same_step
    eng = opt_engine(block_size=4, max_model_len=64)
    steps: list = []
    orig = eng._execute

    def spy(batch):
        steps.append((batch, next_decode(eng, batch) if batch.kind == "decode" else None,
                      [s.params for s in batch.sample_seqs]))
        return orig(batch)

    eng._execute = spy
    for i in range(5):
        eng.rollout_add([(11 * i + j) % 512 for j in range(2 + 3 * i)], _sp(40 + i, 14))
    eng.rollout_run_turns()
    checked = 0
    for (a, pred, params), (b, _, _) in zip(steps, steps[1:]):
        if a.kind == b.kind == "decode" and [s.seq_id for s in a.seqs] == [s.seq_id for s in b.seqs]:
            assert pred is not None and same_step(pred, params, b), "a step every sequence survived was not foretold"
            checked += 1
        if pred is not None:
            assert pred.input_ids.shape == b.input_ids.shape or not same_step(pred, params, b)
    grew = sum(1 for (a, _, _), (b, _, _) in zip(steps, steps[1:])
               if a.kind == b.kind == "decode" and b.block_tables.shape[1] > a.block_tables.shape[1])
    assert checked >= 5 and grew > 0, (checked, grew)


def test_no_prediction_when_the_next_step_is_unknowable(opt_engine):
    from optimized.lookahead import next_decode
    eng = opt_engine(block_size=4, max_model_len=64)
    seen: list = []
    orig = eng._execute

    def spy(batch):
        if batch.kind == "decode":
            seen.append((tuple(s.num_tokens - s.turn_start for s in batch.seqs), next_decode(eng, batch)))
        return orig(batch)

    eng._execute = spy
    eng.rollout_add([1, 2, 3], reference.SamplingParams(max_tokens=4, stop_token_ids=()))
    eng.rollout_run_turns()
    # decode steps sample tokens 2, 3, 4 of the turn; the one sampling the 4th ends the turn by length
    assert [n for n, _ in seen] == [(1,), (2,), (3,)]
    assert seen[0][1] is not None and seen[1][1] is not None and seen[2][1] is None
    # a sequence waiting for admission: the next step is a prefill
    eng2 = opt_engine(block_size=4, max_model_len=64)
    last: list = []
    orig2 = eng2._execute
    eng2._execute = lambda batch: (last.append(batch), orig2(batch))[1]
    eng2.rollout_add([1, 2, 3], _sp(1, 20))
    eng2.rollout_run_turns(max_steps=3)                      # prefill, then decode steps feeding positions 3, 4
    assert last[-1].kind == "decode" and next_decode(eng2, last[-1]) is not None
    eng2.rollout_add([4, 5], _sp(2, 20))
    assert next_decode(eng2, last[-1]) is None
    assert eng2.runner._ahead is None
    # the page the next step writes is shared (as a group's prompt page is): copy-on-write comes first
    seq = last[-1].seqs[0]
    page = seq.block_table[seq.num_tokens // 4]
    extra = eng2.blocks.share([page])
    assert next_decode(eng2, last[-1]) is None
    eng2.blocks.free(extra)
    eng2.scheduler.waiting.clear()
    assert next_decode(eng2, last[-1]) is not None
