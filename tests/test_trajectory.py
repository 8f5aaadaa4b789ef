"""Trajectories: token ids, assistant mask, logprobs, spans, turn count, the trainer's loss-mask shift."""

from __future__ import annotations

import json
import random

import torch
from hypothesis import given, settings, strategies as st

from reference import SamplingParams, Trajectory

from _helpers import examples, drive, rand_ids, tiny_engine


def check_trajectory(traj: Trajectory, rec=None) -> None:
    n = len(traj.token_ids)
    assert len(traj.assistant_mask) == n, "assistant_mask not aligned with token_ids"
    assert set(traj.assistant_mask) <= {0, 1}
    if traj.logprobs is not None:
        assert len(traj.logprobs) == n, "logprobs not aligned with token_ids"
    # spans: contiguous, covering [0, n), prompt first, then assistant/observation alternating
    assert traj.spans and traj.spans[0].kind == "prompt" and traj.spans[0].start == 0
    assert traj.spans[0].end == traj.prompt_len
    assert traj.spans[-1].end == n, f"spans end at {traj.spans[-1].end}, trajectory has {n} tokens"
    for a, b in zip(traj.spans, traj.spans[1:]):
        assert a.end == b.start, f"spans not contiguous: {a} then {b}"
        assert {a.kind, b.kind} in ({"prompt", "assistant"}, {"assistant", "observation"}), f"{a.kind} -> {b.kind}"
    for s in traj.spans:
        assert s.start <= s.end
        want = 1 if s.kind == "assistant" else 0
        assert traj.assistant_mask[s.start:s.end] == [want] * (s.end - s.start), f"mask wrong on {s}"
        if s.kind == "assistant":
            assert s.end > s.start, "an assistant turn has at least one token"
        if traj.logprobs is not None and s.kind != "assistant":
            assert traj.logprobs[s.start:s.end] == [0.0] * (s.end - s.start), f"logprobs must be 0.0 on {s}"
    assert traj.num_turns == sum(s.kind == "assistant" for s in traj.spans)
    assert traj.loss_mask() == traj.assistant_mask[1:] + [0]
    assert len(traj.loss_mask()) == n
    wv = getattr(traj, "weights_versions", None)
    if wv:
        assert len(wv) == n and all((v >= 0) == bool(m) for v, m in zip(wv, traj.assistant_mask)), \
            "weights_versions must be -1 exactly on tokens that were not sampled"
    if hasattr(traj, "to_verl"):
        v = traj.to_verl()
        assert v["prompt_ids"] + v["response_ids"] == traj.token_ids
        assert v["response_mask"] == traj.assistant_mask[traj.prompt_len:]
        assert len(v["response_mask"]) == len(v["response_ids"])
        if traj.logprobs is not None:
            assert v["response_logprobs"] == traj.logprobs[traj.prompt_len:]
    if hasattr(traj, "to_dict"):
        d = json.loads(json.dumps(traj.to_dict()))
        assert d["token_ids"] == traj.token_ids and d["assistant_mask"] == traj.assistant_mask
    if rec is not None:
        turns = [s for s in traj.spans if s.kind == "assistant"]
        assert len(turns) == len(rec.outputs)
        for s, out in zip(turns, rec.outputs):
            assert traj.token_ids[s.start:s.end] == out.token_ids
            assert s.start == out.context_len
            if traj.logprobs is not None:
                assert traj.logprobs[s.start:s.end] == out.logprobs
        obs = [s for s in traj.spans if s.kind == "observation"]
        assert [traj.token_ids[s.start:s.end] for s in obs] == rec.observations
        assert traj.stop_reason == rec.outputs[-1].stop_reason


def test_trajectory_layout_and_teacher_forced_logprobs():
    eng = tiny_engine(block_size=4)
    stop = eng.generate([[7, 8, 9]], SamplingParams(max_tokens=2, stop_token_ids=()))[0][-1]
    sp = SamplingParams(max_tokens=5, stop_token_ids=(stop,), logprobs=True)
    obs_lens = [3, 0, 9, 1]
    recs = drive(eng, [([7, 8, 9], sp), (list(range(20, 37)), sp)], turns=5,
                 obs_fn=lambda i, k, t: rand_ids(random.Random(k), obs_lens[k % 4]))
    for r in recs:
        traj = r.trajectory
        check_trajectory(traj, r)
        assert traj.num_turns == 5 and traj.prompt_len == len(r.prompt)
        # teacher forcing: logits at t-1 predict token t; the recorded logprob is log_softmax there
        lsm = torch.log_softmax(eng.score(traj.token_ids), -1)
        for t, m in enumerate(traj.assistant_mask):
            if m:
                want = lsm[t - 1, traj.token_ids[t]].item()
                assert abs(traj.logprobs[t] - want) <= 1e-4, f"position {t}: logprob {traj.logprobs[t]} vs {want}"
                # greedy: the sampled token is the argmax of the teacher-forced logits
                assert traj.token_ids[t] == int(lsm[t - 1].argmax())
        # the loss mask selects exactly the logits rows that predict sampled tokens
        lm = traj.loss_mask()
        assert [t + 1 for t, m in enumerate(lm) if m] == [t for t, m in enumerate(traj.assistant_mask) if m]
    assert any(o.stop_reason == "stop_token" for r in recs for o in r.outputs)


def test_trajectory_without_logprobs():
    eng = tiny_engine()
    sp = SamplingParams(max_tokens=3, stop_token_ids=(), logprobs=False)
    recs = drive(eng, [([1, 2, 3], sp)], turns=3, obs_fn=lambda i, k, t: [4, 5])
    assert all(o.logprobs is None for o in recs[0].outputs)
    assert recs[0].trajectory.logprobs is None
    check_trajectory(recs[0].trajectory, recs[0])


@settings(max_examples=examples(25))
@given(prompt_len=st.integers(1, 20), turns=st.integers(1, 5), data=st.data())
def test_trajectory_random(prompt_len, turns, data):
    eng = tiny_engine(block_size=data.draw(st.sampled_from([1, 4, 16])), max_model_len=data.draw(st.integers(40, 120)))
    sp = SamplingParams(temperature=data.draw(st.sampled_from([0.0, 0.8])), top_p=0.9,
                        max_tokens=data.draw(st.integers(1, 6)), stop_token_ids=(3, 4, 5), seed=1)
    obs = data.draw(st.lists(st.integers(0, 20), min_size=turns, max_size=turns))
    recs = drive(eng, [(rand_ids(random.Random(prompt_len), prompt_len), sp)], turns,
                 obs_fn=lambda i, k, t: rand_ids(random.Random(k), obs[k]))
    check_trajectory(recs[0].trajectory, recs[0])


def test_trajectory_of_waiting_and_paused_sequences():
    eng = tiny_engine()
    sp = SamplingParams(max_tokens=2, stop_token_ids=())
    a = eng.rollout_add([1, 2], sp)
    b = eng.rollout_add([3, 4, 5], sp)
    eng.rollout_run_turns()
    eng.rollout_continue(a, [9, 9, 9])                  # waiting, observation not yet prefilled
    ta, tb = eng.rollout_finish(a), eng.rollout_finish(b)
    check_trajectory(ta)
    check_trajectory(tb)
    assert [s.kind for s in ta.spans] == ["prompt", "assistant", "observation"] and ta.num_turns == 1
    assert ta.token_ids[-3:] == [9, 9, 9]
    assert [s.kind for s in tb.spans] == ["prompt", "assistant"]
    c = eng.rollout_add([6], sp)
    tc = eng.rollout_finish(c)                           # never ran
    check_trajectory(tc)
    assert tc.token_ids == [6] and tc.num_turns == 0 and tc.stop_reason is None


def test_trajectory_of_sequence_finished_mid_turn():
    """``rollout_finish`` works in any state; a sequence stopped mid-turn (left running by ``generate``)
    still needs spans covering every token, with its sampled tokens in an assistant span."""
    eng = tiny_engine()
    sid = eng.rollout_add([5, 6, 7], SamplingParams(max_tokens=10, stop_token_ids=()))
    eng.generate([[8, 9]], SamplingParams(max_tokens=1, stop_token_ids=()))
    assert eng.state(sid) == "running"
    traj = eng.rollout_finish(sid)
    assert len(traj.token_ids) > 3 and traj.assistant_mask[3:] == [1] * (len(traj.token_ids) - 3)
    check_trajectory(traj)
    assert eng.num_free_blocks == eng.num_blocks
