"""SAMPLE: seeded sampling is reproducible, independent of batch mates and turn splits, and equals the reference
sampler on the fp32 oracle's logits where margins allow."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import dataclasses
import random

import pytest

from conformance import cases
from conformance.harness import (GenerateCache, Tally, check_bookkeeping, compare_with_regen, drive, require_share,
                                 rollouts_vs_oracle, turns_vs_generate)
from conformance.tolerance import MIN_COMPARED_SHARE

pytestmark = pytest.mark.clause("SAMPLE")


def _params(case, rng: random.Random, n: int, max_tokens: int):
    """A spread of sampling parameters: temperature, top-k, top-p, both logprob modes, distinct seeds."""
    stops = cases.stop_set(rng, case.cfg.vocab_size, 0.02)
    grid = [dict(temperature=1.0), dict(temperature=0.7, top_k=8), dict(temperature=1.2, top_p=0.8),
            dict(temperature=0.9, top_k=30, top_p=0.9, logprobs_mode="processed"),
            dict(temperature=1.0, logprobs_mode="processed"), dict(temperature=0.0)]
    return [case.sp(max_tokens=max_tokens, stop_token_ids=stops, seed=rng.randrange(2**63), **grid[i % len(grid)])
            for i in range(n)]


def _prompts(case, rng, scale, n):
    return [cases.random_tokens(rng, case.cfg.vocab_size, rng.randint(1, scale.max_prompt)) for _ in range(n)]


def test_reproducible_run_to_run(conf, scale, model):
    """The same seeded rollouts twice on one engine and once on a fresh engine: identical tokens and logprobs."""
    case = conf.case(model, "SAMPLE")
    rng = random.Random(21)
    n = min(scale.n_seqs, 6)
    sps = _params(case, rng, n, scale.max_tokens)
    wl = cases.greedy_workload(case.cfg, case.block_size, scale, seed=22, n_seqs=n)
    for p, sp in zip(wl.plans, sps):
        p.sp = sp
    eng = case.engine()
    results = []
    for label, e in (("first run", eng), ("second run", eng), ("fresh engine", case.engine())):
        with case.guard():
            runs = drive(case, e, wl)
        results.append((label, [(list(r.trajectory.token_ids), r.trajectory.logprobs) for r in runs]))
    base = results[0][1]
    for label, res in results[1:]:
        for i, (a, b) in enumerate(zip(base, res)):
            case.check(a[0] == b[0], lambda: f"{label}: sequence {i} sampled different tokens\nfirst {a[0]}\nthen  {b[0]}")
            case.check(a[1] == b[1], lambda: f"{label}: sequence {i} reported different logprobs")
    with case.guard():
        g1 = [eng.generate([p.prompt], p.sp)[0] for p in wl.plans[:3]]
        g2 = [eng.generate([p.prompt], p.sp)[0] for p in wl.plans[:3]]
    case.check(g1 == g2, lambda: f"generate is not reproducible: {g1} then {g2}")


def test_independent_of_batch_mates(conf, scale, model):
    """Each seeded sequence alone vs together with mates of other params (and greedy mates): same tokens wherever
    the step is robust to the noise bound."""
    case = conf.case(model, "SAMPLE")
    rng = random.Random(23)
    n = min(scale.n_seqs, 6)
    sps = _params(case, rng, n, 2 * scale.max_tokens)
    prompts = _prompts(case, rng, scale, n)
    eng = case.engine()
    bound = case.noise(eng).bound
    with case.guard():
        together: list[list[int]] = []
        sids = [eng.rollout_add(p, sp) for p, sp in zip(prompts, sps)]
        outs = eng.rollout_run_turns()
        together = [list(outs[s].token_ids) for s in sids]
        for s in sids:
            eng.rollout_finish(s)
    gen = GenerateCache(case, eng)
    tally = Tally()
    for i, (p, sp) in enumerate(zip(prompts, sps)):
        with case.guard():
            alone = gen(p, sp)
        tally.add(compare_with_regen(case, f"sequence {i} with batch mates vs alone", p, together[i], alone, sp,
                                     bound, gen))
    require_share(case, tally, "compared", MIN_COMPARED_SHARE, "batch mates")


def test_independent_of_turn_split(conf, scale, model):
    """Seeded multi-turn sampling: each turn equals single-shot generate over the concatenated context with the same
    params (randomness is a function of (seed, absolute position) only)."""
    case = conf.case(model, "SAMPLE")
    wl = cases.greedy_workload(case.cfg, case.block_size, scale, seed=24, temperature=1.0,
                               n_seqs=min(scale.n_seqs, 6), stagger=True)
    eng = case.engine()
    with case.guard():
        runs = drive(case, eng, wl)
    check_bookkeeping(case, eng, runs)
    tally = turns_vs_generate(case, eng, runs, case.noise(eng).bound, label="sampled: ")
    require_share(case, tally, "compared", MIN_COMPARED_SHARE, "sampled multi-turn vs generate")


def test_matches_reference_sampler(conf, scale, model):
    """Teacher-forced along the engine's trajectories: at every robust step the token is the one
    reference.sampling.sample_one draws from the fp32 oracle logits (same seed, same absolute position), and the
    logprobs follow logprobs_mode (raw: model distribution; processed: after temperature/top-k/top-p)."""
    case = conf.case(model, "SAMPLE")
    rng = random.Random(25)
    n = min(scale.oracle_seqs, 6)
    wl = cases.greedy_workload(case.cfg, case.block_size, scale, seed=26, n_seqs=n, n_turns=2)
    for p, sp in zip(wl.plans, _params(case, rng, n, scale.max_tokens)):
        p.sp = sp
    rollouts_vs_oracle(case, wl, "sampled tokens vs reference sampler", lambda r: f"sequence {r.sid} ({r.plan.sp})")


def test_seed_and_temperature_matter(conf, scale, model):
    """Non-vacuity: different seeds give different samples, sampling differs from greedy, and at temperature 0
    'processed' logprobs equal 'raw' ones."""
    case = conf.case(model, "SAMPLE")
    rng = random.Random(27)
    prompts = _prompts(case, rng, scale, 4)
    eng = case.engine()
    base = dict(max_tokens=2 * scale.max_tokens, stop_token_ids=())
    with case.guard():
        a = eng.generate(prompts, case.sp(temperature=1.0, seed=1, **base))
        b = eng.generate(prompts, case.sp(temperature=1.0, seed=2, **base))
        g = eng.generate(prompts, case.sp(temperature=0.0, **base))
    case.check(a != b, "seeds 1 and 2 sampled identical tokens for every prompt")
    case.check(a != g, "temperature 1.0 sampled exactly the greedy tokens for every prompt")
    raw = case.sp(temperature=0.0, logprobs_mode="raw", **base)
    proc = dataclasses.replace(raw, logprobs_mode="processed")
    case.name_sp(proc)
    lps = []
    for sp in (raw, proc):
        with case.guard():
            sid = eng.rollout_add(prompts[0], sp)
            out = eng.rollout_run_turns()[sid]
            eng.rollout_finish(sid)
        lps.append((list(out.token_ids), list(out.logprobs or [])))
    case.check(lps[0] == lps[1], lambda: f"greedy 'processed' logprobs differ from 'raw': {lps[1]} vs {lps[0]}")
