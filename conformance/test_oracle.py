"""ORACLE: greedy tokens equal the no-cache oracle (``reference.oracle``) wherever its margin is decisive."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import random

import pytest

from conformance import cases, oracles
from conformance.harness import (Tally, early_stop, expected_stop, free_running_tally, oracle_tally,
                                 require_share, rollouts_vs_oracle)
from conformance.tolerance import min_decisive_share, min_free_running_share
from reference.oracle import OracleTurn, oracle_generate

pytestmark = pytest.mark.clause("ORACLE")


def _prompts(case, scale, seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    bs = case.block_size
    lens = cases.boundary_lengths(bs, max(scale.max_prompt, 2 * bs + 1))
    return [cases.random_tokens(rng, case.cfg.vocab_size, lens[i % len(lens)] if i % 2 else rng.randint(1, scale.max_prompt))
            for i in range(n)]


def _check_stop(case, eng, i: int, prompt: list[int], toks: list[int], sp, stops: str) -> None:
    """generate() output ``i`` ends exactly where the stop rule says (not before, not after)."""
    case.check(expected_stop(len(prompt), toks, sp, eng.max_model_len) is not None and
               early_stop(len(prompt), toks, sp, eng.max_model_len) is None,
               lambda: f"generate prompt {i}: {toks} does not end where the stop rule says ({stops}, "
                       f"max_tokens {sp.max_tokens})")


def test_generate_matches_oracle(conf, scale, model):
    """generate(): every decisive step picks the oracle's token (teacher-forced along the engine's own tokens) and
    every turn ends exactly where the stop rule says; the decisive share is reported and must reach the minimum."""
    case = conf.case(model, "ORACLE")
    eng = case.engine()
    noise = case.noise(eng)
    rng = random.Random(11)
    stops = cases.stop_set(rng, case.cfg.vocab_size)
    sp = case.sp(temperature=0.0, max_tokens=2 * scale.max_tokens, stop_token_ids=stops)
    prompts = _prompts(case, scale, 12, scale.oracle_seqs)
    with case.guard():
        outs = eng.generate(prompts, sp)
    tally = Tally()
    for i, (p, toks) in enumerate(zip(prompts, outs)):
        toks = [int(t) for t in toks]
        _check_stop(case, eng, i, p, toks, sp, f"stops {stops}")
        tally.add(oracle_tally(case, f"generate prompt {i} ({len(p)} tokens)", p, toks, None, sp, noise.bound))
    conf.note(f"[ORACLE] {model}: {noise.describe()}")
    require_share(case, tally, "decisive", min_decisive_share(noise.dtype), "generate vs no-cache oracle")


def test_free_running_oracle(conf, scale, model):
    """generate() against reference.oracle.oracle_generate run free (full recompute each step), re-anchored from the
    engine's tokens after each divergence at a non-decisive step; every decisive step equal, equal stops."""
    case = conf.case(model, "ORACLE")
    eng = case.engine()
    noise = case.noise(eng)
    sp = case.sp(temperature=0.0, max_tokens=scale.max_tokens,
                 stop_token_ids=cases.stop_set(random.Random(13), case.cfg.vocab_size, 0.05))
    prompts = _prompts(case, scale, 14, scale.oracle_seqs)
    with case.guard():
        outs = eng.generate(prompts, sp)
    model_ = oracles.dense_model(model)

    def run_oracle(context: list[int], sp_) -> OracleTurn:
        return oracle_generate(model_, context, sp_, eng.max_model_len)

    tally = Tally()
    for i, (p, toks) in enumerate(zip(prompts, outs)):
        toks = [int(t) for t in toks]
        _check_stop(case, eng, i, p, toks, sp, f"stops {len(sp.stop_token_ids)} ids")
        tally.add(free_running_tally(case, f"generate prompt {i} ({len(p)} tokens)", p, toks, sp, noise.bound,
                                     run_oracle))
    require_share(case, tally, "decisive", min_free_running_share(noise.dtype),
                  "free-running oracle (re-anchored)")


def test_rollout_matches_oracle(conf, scale, model):
    """Multi-turn rollouts: every decisive assistant step picks the oracle's token given the trajectory so far, and
    every sampled-token logprob equals the oracle's log-softmax (2 x noise bound)."""
    case = conf.case(model, "ORACLE")
    wl = cases.greedy_workload(case.cfg, case.block_size, scale, seed=15, stagger=True,
                               n_seqs=min(scale.n_seqs, scale.oracle_seqs))
    rollouts_vs_oracle(case, wl, "rollouts vs no-cache oracle", lambda r: f"sequence {r.sid}")
