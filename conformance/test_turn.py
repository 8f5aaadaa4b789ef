"""TURN: greedy multi-turn rollout == single-shot ``generate`` over the concatenated context."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import random

import pytest

from conformance import cases
from conformance.harness import GenerateCache, Tally, check_bookkeeping, drive, require_share, turns_vs_generate
from conformance.tolerance import MIN_COMPARED_SHARE

pytestmark = pytest.mark.clause("TURN")


def _run(case, eng, wl, label, gen=None, tally=None) -> Tally:
    with case.guard():
        runs = drive(case, eng, wl)
    check_bookkeeping(case, eng, runs)
    t = turns_vs_generate(case, eng, runs, case.noise(eng).bound, gen, label)
    if tally is not None:
        tally.add(t)
    return t


@pytest.mark.parametrize("seed", [1, 7])
def test_multi_turn_equals_single_shot(conf, scale, model, seed):
    """Mixed workload (staggered adds, sequences held paused, empty/short/boundary/multi-block observations, stops):
    every turn equals generate(context) and the trajectory is the exact concatenation."""
    case = conf.case(model, "TURN", note=f"workload: greedy_workload(cfg, {cases.engine_defaults(model)['block_size']}, "
                                          f"SCALES[{scale.name!r}], seed={seed}, stagger=True, holds=True)")
    wl = cases.greedy_workload(case.cfg, case.block_size, scale, seed=seed, stagger=True, holds=True)
    eng = case.engine()
    require_share(case, _run(case, eng, wl, ""), "compared", MIN_COMPARED_SHARE, "multi-turn vs generate")


def test_batch_compositions(conf, scale, model):
    """The same sequences run all together, one at a time (max_num_seqs=1), with chunked prefill
    (max_num_batched_tokens = block_size + 3) and two at a time: each turn equals generate(context)."""
    case = conf.case(model, "TURN")
    bs = case.block_size
    wl = cases.greedy_workload(case.cfg, bs, scale, seed=2, n_seqs=min(scale.n_seqs, 6))
    tally = Tally()
    gen = None
    for label, kw in (("together: ", {}), ("one at a time: ", {"max_num_seqs": 1}),
                      ("chunked prefill: ", {"max_num_batched_tokens": bs + 3}),
                      ("two at a time: ", {"max_num_seqs": 2, "max_num_batched_tokens": 2 * bs + 1})):
        eng = case.engine(**kw)
        gen = gen or GenerateCache(case, eng)   # generate once, on the first engine
        _run(case, eng, wl, label, gen, tally)
    require_share(case, tally, "compared", MIN_COMPARED_SHARE, "batch compositions vs generate")


def test_empty_observations(conf, scale, model):
    """Consecutive empty observations: resume prefills only the pending token, turn after turn."""
    case = conf.case(model, "TURN")
    wl = cases.greedy_workload(case.cfg, case.block_size, scale, seed=3, obs_kind="empty",
                               n_turns=scale.n_turns + 1, n_seqs=min(scale.n_seqs, 4))
    eng = case.engine()
    require_share(case, _run(case, eng, wl, "empty observations: "), "compared", MIN_COMPARED_SHARE,
                  "empty observations")


def test_observations_spanning_many_blocks(conf, scale, model):
    """Observations of 2..obs_max_blocks blocks (prefilled over the cached prefix, possibly in chunks)."""
    case = conf.case(model, "TURN")
    bs = case.block_size
    wl = cases.greedy_workload(case.cfg, bs, scale, seed=4, obs_kind="long", n_seqs=min(scale.n_seqs, 4))
    eng = case.engine(max_num_batched_tokens=3 * bs + 2)
    require_share(case, _run(case, eng, wl, "long observations: "), "compared", MIN_COMPARED_SHARE,
                  "long observations")


def test_block_boundaries(conf, scale, model):
    """Prompts of k*bs - 1, k*bs, k*bs + 1 tokens and observations that end the context on / next to a block boundary."""
    case = conf.case(model, "TURN")
    wl = cases.greedy_workload(case.cfg, case.block_size, scale, seed=5, prompt_kind="boundary", obs_kind="boundary")
    eng = case.engine()
    require_share(case, _run(case, eng, wl, "block boundaries: "), "compared", MIN_COMPARED_SHARE, "block boundaries")


def test_context_limit(conf, scale, model):
    """A turn that reaches max_model_len stops with 'context_limit' and finished=True; generate over the same
    context stops at the same token."""
    case = conf.case(model, "TURN")
    bs = case.block_size
    limit = 3 * bs + 5
    wl = cases.greedy_workload(case.cfg, bs, scale, seed=6, n_seqs=4, n_turns=4, max_tokens=2 * bs,
                               obs_kind="short", prompt_kind="mixed")
    for i, p in enumerate(wl.plans):   # prompts close to the limit, so that the limit is reached
        p.prompt = cases.random_tokens(random.Random(i), case.cfg.vocab_size, max(1, limit - bs - 2 - i))
    eng = case.engine(max_model_len=limit)
    case.check(eng.max_model_len == limit, f"max_model_len={limit} was asked, the engine reports {eng.max_model_len}")
    with case.guard():
        runs = drive(case, eng, wl)
    check_bookkeeping(case, eng, runs)
    hit = [r for r in runs if r.turns and r.turns[-1].stop_reason == "context_limit"]
    case.check(len(hit) >= 1, "no sequence reached the context limit (the case is broken)")
    t = turns_vs_generate(case, eng, runs, case.noise(eng).bound, label="context limit: ")
    require_share(case, t, "compared", MIN_COMPARED_SHARE, "context limit")
