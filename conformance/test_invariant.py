"""INVARIANT: in batch-invariant mode a sequence's logits are bitwise identical whatever its batch mates
and however its context was split into turns. Observed through the public interface: its sampled tokens
and their logprobs (a function of the logits row) must be bitwise equal."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import random

import pytest

from conformance import cases, engines
from reference.errors import ConfigError

pytestmark = pytest.mark.clause("INVARIANT")


def _kw(case) -> dict:
    kw = {"batch_invariant": True}
    if str(case.defaults.get("split_kv", "")) == "auto":      # auto depends on the batch shape: forbidden here
        kw["split_kv"] = "fixed:16"
    return kw


def _invariant_engine(case):
    """An engine in batch-invariant mode, or a skip (never a pass) if the engine has no such mode."""
    try:
        engines.build(case.conf.factory, case.conf.spec, case.cfg, case.weights, **{**case.defaults, **_kw(case)})
    except ConfigError as e:
        pytest.skip(f"[INVARIANT] {case.conf.spec} cannot run batch-invariant mode here: {e} (a skip, not a pass)")
    return case.engine(**_kw(case))


def _two_turns(case, eng, target, mates, obs, mates_first):
    sp = case.sp(temperature=0.0, max_tokens=5, stop_token_ids=())
    msp = case.sp(temperature=0.9, max_tokens=4, stop_token_ids=(), seed=5)
    with case.guard():
        if mates_first:
            for m in mates:
                eng.rollout_add(m, msp)
        sid = eng.rollout_add(target, sp)
        if not mates_first:
            for m in mates:
                eng.rollout_add(m, msp)
        first = eng.rollout_run_turns()
        for s in first:
            if not first[s].finished:
                eng.rollout_continue(s, obs)
        second = eng.rollout_run_turns()
    return first[sid], second[sid]


def test_bitwise_across_batch_mates_and_turn_splits(conf, model):
    case = conf.case(model, "INVARIANT")
    rng = random.Random(31)
    V = case.cfg.vocab_size
    target = cases.random_tokens(rng, V, 13)
    obs = cases.random_tokens(rng, V, 2 * case.block_size + 1)
    a1, a2 = _two_turns(case, _invariant_engine(case), target, [], obs, True)
    for n, first in ((3, True), (5, False)):
        mates = [cases.random_tokens(rng, V, rng.randint(1, 40)) for _ in range(n)]
        b1, b2 = _two_turns(case, case.engine(**_kw(case)), target, mates, obs, first)
        for label, x, y in (("turn 1", a1, b1), ("turn 2", a2, b2)):
            case.check(x.token_ids == y.token_ids, lambda: f"{label}: tokens changed with {n} batch mates")
            case.check(x.logprobs == y.logprobs, lambda: f"{label}: logprobs not bitwise equal with {n} batch mates\n"
                                                         f"alone {x.logprobs}\nmates {y.logprobs}")
    # the second turn, resumed over cached KV, against one prefill of the concatenated context
    ctx = target + a1.token_ids + obs
    one = case.engine(**_kw(case))
    with case.guard():
        sid = one.rollout_add(ctx, case.sp(temperature=0.0, max_tokens=5, stop_token_ids=()))
        single = one.rollout_run_turns()[sid]
    case.check(single.token_ids == a2.token_ids, lambda: "resumed turn and single-shot prefill sampled different tokens")
    case.check(single.logprobs == a2.logprobs, lambda: f"resumed turn and single-shot prefill: logprobs not bitwise "
                                                       f"equal\nresumed {a2.logprobs}\nsingle  {single.logprobs}")
