"""STATE: every bad input of DESIGN §2 raises a typed error and leaves the engine's state unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference import (ConfigError, ContextLimitError, Engine, EngineConfig, InvalidTokenError, ModelConfig,
                       SamplingParams, SequenceStateError, TurnKVError, UnknownSequenceError)

from _helpers import TINY, tiny_engine

V = TINY.vocab_size
SP = SamplingParams(max_tokens=3, stop_token_ids=())


@pytest.fixture
def busy():
    """An engine with a paused (a), a waiting (b), a context-limit-finished (c) and a collected (d) sequence."""
    eng = tiny_engine(block_size=4, num_blocks=40, max_model_len=32)
    a = eng.rollout_add([5, 6, 7, 8, 9], SP)
    c = eng.rollout_add(list(range(1, 31)), SamplingParams(max_tokens=10, stop_token_ids=()))
    d = eng.rollout_add([1, 2], SP)
    outs = eng.rollout_run_turns()
    assert outs[c].stop_reason == "context_limit"
    eng.rollout_finish(d)
    b = eng.rollout_add([3, 4, 5], SP)
    assert [eng.state(s) for s in (a, b, c)] == ["paused", "waiting", "finished"]
    return eng, dict(a=a, b=b, c=c, d=d)


def _rejects(eng, exc, fn, *args):
    before = eng.snapshot()
    free = eng.num_free_blocks
    with pytest.raises(exc) as ei:
        fn(*args)
    assert isinstance(ei.value, TurnKVError), f"{type(ei.value).__name__} is not a turnkv error"
    assert eng.snapshot() == before, f"{fn.__name__}{args!r} raised {getattr(exc, '__name__', exc)} but changed the engine state"
    assert eng.num_free_blocks == free
    return ei.value


def _still_works(eng, ids):
    """After the rejected calls the engine behaves like one that never saw them."""
    eng.rollout_continue(ids["a"], [11, 12])
    outs = eng.rollout_run_turns()
    fresh = tiny_engine(block_size=4, num_blocks=40, max_model_len=32)
    a = fresh.rollout_add([5, 6, 7, 8, 9], SP)
    fresh.rollout_run_turns()
    fresh.rollout_continue(a, [11, 12])
    want = fresh.rollout_run_turns()[a]
    assert outs[ids["a"]].token_ids == want.token_ids
    assert ids["b"] in outs and len(outs[ids["b"]].token_ids) == 3


def test_unknown_and_collected_ids(busy):
    eng, ids = busy
    for bad in (999, -1, ids["b"] + 1):
        _rejects(eng, UnknownSequenceError, eng.rollout_continue, bad, [1])
        _rejects(eng, UnknownSequenceError, eng.rollout_finish, bad)
        _rejects(eng, UnknownSequenceError, eng.state, bad)
        _rejects(eng, UnknownSequenceError, eng.block_table, bad)
    for bad in ("0", None, 0.0, True, [0]):
        _rejects(eng, UnknownSequenceError, eng.rollout_continue, bad, [1])
        _rejects(eng, UnknownSequenceError, eng.rollout_finish, bad)
    # a finished-and-collected id
    _rejects(eng, (SequenceStateError, UnknownSequenceError), eng.rollout_continue, ids["d"], [1])
    _rejects(eng, (SequenceStateError, UnknownSequenceError), eng.rollout_finish, ids["d"])
    _rejects(eng, (SequenceStateError, UnknownSequenceError), eng.state, ids["d"])
    _still_works(eng, ids)


def test_continue_on_non_paused(busy):
    eng, ids = busy
    _rejects(eng, SequenceStateError, eng.rollout_continue, ids["b"], [1])   # waiting
    _rejects(eng, SequenceStateError, eng.rollout_continue, ids["b"], [])
    _rejects(eng, SequenceStateError, eng.rollout_continue, ids["c"], [1])   # finished by the context limit
    eng.rollout_continue(ids["a"], [1, 2])                                    # now waiting
    _rejects(eng, SequenceStateError, eng.rollout_continue, ids["a"], [3])    # continue twice
    # a running sequence (left mid-turn by a generate call)
    r = eng.rollout_add([1, 2, 3, 4], SamplingParams(max_tokens=20, stop_token_ids=()))
    eng.generate([[7]], SamplingParams(max_tokens=1, stop_token_ids=()))
    assert eng.state(r) == "running"
    _rejects(eng, SequenceStateError, eng.rollout_continue, r, [1])


BAD_TOKENS = [
    ("negative", [1, -1, 2]),
    ("== vocab", [1, V]),
    ("> vocab", [V + 7]),
    ("huge", [2**70]),
    ("str token", [1, "2"]),
    ("float token", [1, 2.0]),
    ("None token", [None]),
    ("bool token", [True, 1]),
    ("bool False", [False]),
    ("float tensor", torch.tensor([1.0, 2.0])),
    ("bool tensor", torch.tensor([True, False])),
    ("2-D tensor", torch.tensor([[1, 2]])),
    ("0-d tensor", torch.tensor(3)),
    ("out-of-vocab tensor", torch.tensor([1, V])),
    ("negative tensor", torch.tensor([-3])),
    ("float numpy", np.array([1.5])),
    ("2-D numpy", np.array([[1, 2]])),
    ("str", "123"),
    ("bytes", b"12"),
    ("int", 5),
    ("None", None),
]


@pytest.mark.parametrize("what,bad", BAD_TOKENS, ids=[w for w, _ in BAD_TOKENS])
def test_bad_token_ids_everywhere(busy, what, bad):
    eng, ids = busy
    _rejects(eng, InvalidTokenError, eng.rollout_add, bad, SP)
    _rejects(eng, InvalidTokenError, eng.rollout_continue, ids["a"], bad)
    _rejects(eng, InvalidTokenError, eng.generate, [[1, 2], bad], SP)
    _rejects(eng, InvalidTokenError, eng.score, bad)
    _still_works(eng, ids)


def test_good_token_containers_accepted(busy):
    eng, _ = busy
    want = eng.generate([[1, 2, 3]], SP)[0]
    for ids in (torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3], dtype=torch.int32), np.array([1, 2, 3]),
                (1, 2, 3), range(1, 4)):
        assert eng.generate([ids], SP)[0] == want, f"{type(ids).__name__} prompt"


def test_empty_prompts(busy):
    eng, ids = busy
    for empty in ([], (), torch.tensor([], dtype=torch.long), np.array([], dtype=np.int64)):
        _rejects(eng, InvalidTokenError, eng.rollout_add, empty, SP)
        _rejects(eng, InvalidTokenError, eng.generate, [[1], empty], SP)
        _rejects(eng, InvalidTokenError, eng.score, empty)
    _rejects(eng, InvalidTokenError, eng.generate, [1, 2, 3], SP)            # a flat list is not a batch
    _rejects(eng, InvalidTokenError, eng.generate, torch.tensor([[1, 2]]), SP)
    # an empty observation is legal
    eng.rollout_continue(ids["a"], [])
    assert eng.state(ids["a"]) == "waiting"


def test_context_limit_inputs(busy):
    eng, ids = busy
    L = eng.max_model_len
    assert L == 32
    _rejects(eng, ContextLimitError, eng.rollout_add, list(range(L)), SP)        # no room to generate
    _rejects(eng, ContextLimitError, eng.rollout_add, list(range(L + 5)), SP)
    _rejects(eng, ContextLimitError, eng.generate, [[1], list(range(L))], SP)
    _rejects(eng, ContextLimitError, eng.score, list(range(L + 1)))
    n = len(eng.snapshot()["seqs"][ids["a"]][1])
    _rejects(eng, ContextLimitError, eng.rollout_continue, ids["a"], [1] * (L - n))       # n + obs + 1 > L
    _rejects(eng, ContextLimitError, eng.rollout_continue, ids["a"], [1] * (3 * L))
    assert eng.score(list(range(L))).shape == (L, V)
    eng.rollout_continue(ids["a"], [1] * (L - n - 1))                               # exactly fits
    _still_ok = eng.rollout_run_turns()[ids["a"]]
    assert _still_ok.stop_reason == "context_limit" and len(_still_ok.token_ids) == 1


def test_bad_sampling_params_objects(busy):
    eng, _ = busy
    for bad in ("greedy", {"temperature": 0.0}, 0.7):
        _rejects(eng, ConfigError, eng.rollout_add, [1, 2], bad)
        _rejects(eng, ConfigError, eng.generate, [[1, 2]], bad)


BAD_SP = [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_k=-1), dict(top_p=0.0),
          dict(top_p=1.5), dict(top_p=float("nan")), dict(top_p=-0.2), dict(max_tokens=0), dict(max_tokens=-3),
          dict(seed=-1), dict(seed=2**64), dict(logprobs_mode="sampled"), dict(logprobs_mode=None)]


@pytest.mark.parametrize("kw", BAD_SP, ids=[str(k) for k in BAD_SP])
def test_bad_sampling_params_values(kw):
    with pytest.raises(ConfigError):
        SamplingParams(**kw)


BAD_SP_TYPES = [dict(temperature=1.0, seed=0.5), dict(temperature=1.0, top_k=2.5), dict(max_tokens=2.5),
                dict(temperature="1"), dict(top_p="0.9"), dict(stop_token_ids=None)]


@pytest.mark.parametrize("kw", BAD_SP_TYPES, ids=[str(k) for k in BAD_SP_TYPES])
def test_bad_sampling_params_types(kw):
    """A wrongly typed field is a bad SamplingParams: ConfigError at construction. (A float seed or top_k
    accepted here crashes later, in the middle of a step, with an untyped TypeError.)"""
    with pytest.raises(ConfigError):
        SamplingParams(**kw)


BAD_ENGINE = [dict(split_kv="auto", batch_invariant=True), dict(split_kv="fixed:0"), dict(split_kv="fixed:-2"),
              dict(split_kv="fixed:x"), dict(split_kv="fixed"), dict(split_kv="bogus"), dict(split_kv=""),
              dict(block_size=0), dict(num_blocks=0), dict(max_num_seqs=0), dict(max_num_batched_tokens=0),
              dict(max_model_len=1), dict(dtype="float16"), dict(prefill_chunking="balanced")]


@pytest.mark.parametrize("kw", BAD_ENGINE, ids=[str(k) for k in BAD_ENGINE])
def test_bad_engine_config(kw):
    with pytest.raises(ConfigError):
        EngineConfig(**kw)
    with pytest.raises(ConfigError):
        Engine.from_pretrained("tiny", **kw)


def test_good_engine_configs():
    for kw in (dict(split_kv="fixed:3", batch_invariant=True), dict(split_kv="disabled", batch_invariant=True),
               dict(split_kv="auto"), dict(dtype="bfloat16")):
        assert EngineConfig(**kw).policy is not None
    with pytest.raises(ConfigError):
        Engine.from_pretrained("no-such-model")


@pytest.mark.parametrize("kw", [dict(num_attention_heads=4, num_key_value_heads=3), dict(head_dim=31),
                                dict(hidden_size=0), dict(vocab_size=0), dict(rms_norm_eps=0.0),
                                dict(rope_theta=-1.0)])
def test_bad_model_config(kw):
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8)
    with pytest.raises(ConfigError):
        ModelConfig(**(base | kw))
