"""MEM: blocks grow by the delta only, nothing leaks, paused sequences are accounted, small pools lose nothing."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import random

import pytest

from conformance import cases
from conformance.harness import (GenerateCache, check_bookkeeping, compare_with_regen, drive, require_share,
                                 turns_vs_generate)
from conformance.tolerance import MIN_COMPARED_SHARE

pytestmark = pytest.mark.clause("MEM")


def _blocks(n: int, bs: int) -> int:
    return (n + bs - 1) // bs


class Accounting:
    """After every public call: free + all live tables == pool, tables disjoint, page ids in range."""

    def __init__(self, case, eng) -> None:
        self.case, self.eng = case, eng
        self.checks = 0

    def __call__(self, event, runs, r) -> None:
        eng, case = self.eng, self.case
        live = [x.sid for x in runs if x.sid is not None and x.trajectory is None]
        tables = {sid: eng.block_table(sid) for sid in live}
        used = [p for t in tables.values() for p in t]
        free = eng.num_free_blocks
        self.checks += 1
        case.check(len(used) == len(set(used)), lambda: f"after {event}: a page is in two block tables: {tables}")
        case.check(all(0 <= p < eng.num_blocks for p in used), lambda: f"after {event}: page ids outside the pool: {tables}")
        case.check(free + len(used) == eng.num_blocks, lambda: (
            f"after {event}: {free} free + {len(used)} in block tables != {eng.num_blocks} blocks in the pool "
            f"(paused sequences must be accounted; a leak or a double count)\ntables {tables}"))


def test_resume_grows_by_delta_only(conf, scale, model):
    """A resumed turn prefills exactly [pending] + observation (a fresh one: the prompt), and its block table after the
    turn extends the table it held while paused; a paused table holds ceil((len-1)/bs)..ceil(len/bs) blocks."""
    case = conf.case(model, "MEM")
    bs = case.block_size
    wl = cases.greedy_workload(case.cfg, bs, scale, seed=41, n_seqs=min(scale.n_seqs, 5))
    eng = case.engine()
    acct = Accounting(case, eng)
    paused_tables: dict[int, list[int]] = {}
    counted = {"resumes": 0}

    def hook(event, runs, r):
        acct(event, runs, r)
        if event != "run_turns":
            return
        for x in runs:
            if x.sid is None or x.trajectory is not None or not x.turns:
                continue
            out = x.turns[-1]
            k = len(x.turns) - 1
            want = len(x.plan.prompt) if k == 0 else 1 + len(x.sent_obs[k - 1])
            case.check(out.prefilled_tokens == want, lambda: (
                f"sequence {x.sid} turn {k}: prefilled {out.prefilled_tokens} tokens, expected {want} "
                f"({'the prompt' if k == 0 else '[pending token] + observation of ' + str(want - 1)}): "
                f"a resume must not re-prefill the cached context"))
            table = eng.block_table(x.sid)
            n = len(x.tokens)
            if not out.finished:
                case.check(_blocks(n - 1, bs) <= len(table) <= _blocks(n, bs), lambda: (
                    f"sequence {x.sid} paused with {n} tokens holds {len(table)} blocks; expected "
                    f"{_blocks(n - 1, bs)}..{_blocks(n, bs)} (block size {bs})"))
            old = paused_tables.get(x.sid)
            if old is not None and k > 0:
                counted["resumes"] += 1
                case.check(table[:len(old)] == old, lambda: (
                    f"sequence {x.sid} turn {k}: the block table was rebuilt on resume instead of grown by the delta\n"
                    f"paused {old}\nnow    {table}"))
            paused_tables[x.sid] = table

    with case.guard():
        runs = drive(case, eng, wl, after_call=hook)
    case.check(counted["resumes"] > 0, "no resume happened (the case is broken)")
    check_bookkeeping(case, eng, runs)


def test_no_leak_after_finish(conf, scale, model):
    """Every block is free after all sequences finish (in every state: waiting, resumed, paused, at the limit) and after
    generate(); the accounting invariant holds after every call."""
    case = conf.case(model, "MEM")
    bs = case.block_size
    eng = case.engine(max_model_len=6 * bs + 3)
    total = eng.num_blocks
    # prompts leave a few tokens to generate (the CI scale's all do; the GPU scale's longer ones would not fit)
    wl = cases.greedy_workload(case.cfg, bs, scale, seed=42, n_seqs=min(scale.n_seqs, 5), stagger=True, holds=True,
                               max_prompt=eng.max_model_len - 3)
    with case.guard():
        drive(case, eng, wl, after_call=Accounting(case, eng))
    case.check(eng.num_free_blocks == total, lambda: (
        f"{total - eng.num_free_blocks} of {total} blocks still held after every sequence finished"))
    rng = random.Random(43)
    V = case.cfg.vocab_size
    sp = case.sp(temperature=0.0, max_tokens=3, stop_token_ids=())
    with case.guard():
        eng.generate([cases.random_tokens(rng, V, n) for n in (1, bs, 2 * bs + 1)], sp)
    case.check(eng.num_free_blocks == total, lambda: f"{total - eng.num_free_blocks} blocks held after generate()")
    with case.guard():
        paused = eng.rollout_add(cases.random_tokens(rng, V, 2 * bs + 1), sp)
        resumed = eng.rollout_add(cases.random_tokens(rng, V, bs), sp)
        limit = eng.rollout_add(cases.random_tokens(rng, V, eng.max_model_len - 2), sp)
        eng.rollout_run_turns()
        eng.rollout_continue(resumed, cases.random_tokens(rng, V, bs + 2))   # waiting again, holding its blocks
        waiting = eng.rollout_add(cases.random_tokens(rng, V, 3), sp)       # never ran
        for sid in (paused, resumed, limit, waiting):
            eng.rollout_finish(sid)
    case.check(eng.num_free_blocks == total, lambda: (
        f"{total - eng.num_free_blocks} blocks held after finishing paused / resumed / finished / waiting sequences"))


def test_small_pool_completes_without_loss(conf, scale, model):
    """A pool far smaller than the workload (paused sequences holding blocks, evictions, preemption): every turn of
    every sequence is returned, each equals generate(context), the accounting holds after every call, nothing leaks."""
    case = conf.case(model, "MEM")
    bs = case.block_size
    max_len = 12 * bs
    eng = case.engine(num_blocks=_blocks(max_len, bs) + 3, max_model_len=max_len, max_num_seqs=4)
    wl = cases.greedy_workload(case.cfg, bs, scale, seed=44, n_seqs=min(scale.n_seqs, 6), holds=True, stagger=True,
                               max_prompt=max_len - 3)
    with case.guard():
        runs = drive(case, eng, wl, after_call=Accounting(case, eng))
    check_bookkeeping(case, eng, runs)
    case.check(eng.num_free_blocks == eng.num_blocks, "blocks still held after every sequence finished")
    demand = sum(_blocks(len(r.tokens), bs) for r in runs)
    conf.note(f"[MEM] {model}: small pool of {eng.num_blocks} blocks served a workload of {demand} blocks")
    t = turns_vs_generate(case, eng, runs, case.noise(eng).bound, label="small pool: ")
    require_share(case, t, "compared", MIN_COMPARED_SHARE, "small pool vs generate")


def test_paused_blocks_counted_at_admission(conf, scale, model):
    """A paused sequence holds most of the pool; a new sequence that does not fit beside it still runs (no deadlock),
    and the paused sequence's next turn is still right."""
    case = conf.case(model, "MEM")
    bs = case.block_size
    max_len = 8 * bs
    eng = case.engine(num_blocks=_blocks(max_len, bs) + 1, max_model_len=max_len)
    rng = random.Random(45)
    V = case.cfg.vocab_size
    sp = case.sp(temperature=0.0, max_tokens=bs, stop_token_ids=())
    with case.guard():
        a_prompt = cases.random_tokens(rng, V, 5 * bs)
        a = eng.rollout_add(a_prompt, sp)
        ta = eng.rollout_run_turns()[a]
        held = len(eng.block_table(a))
        b = eng.rollout_add(cases.random_tokens(rng, V, 4 * bs), sp)
        outs = eng.rollout_run_turns()
    case.check(b in outs, lambda: f"the new sequence did not run while a paused one held {held} of {eng.num_blocks} "
                                  f"blocks: run_turns returned {sorted(outs)}")
    case.check(len(eng.block_table(a)) + len(eng.block_table(b)) + eng.num_free_blocks == eng.num_blocks,
               "paused and running tables do not add up with the free blocks")
    obs = cases.random_tokens(rng, V, 2)
    with case.guard():
        eng.rollout_continue(a, obs)
        ta2 = eng.rollout_run_turns()[a]
        eng.rollout_finish(a)
        eng.rollout_finish(b)
        ctx = a_prompt + list(ta.token_ids) + obs
        gen = GenerateCache(case, eng)
        t = compare_with_regen(case, "the paused sequence's next turn after sharing the pool vs generate(context)",
                               ctx, list(ta2.token_ids), gen(ctx, sp), sp, case.noise(eng).bound, gen)
    case.check(t.compared + t.excused == t.total, "comparison incomplete")
    case.check(eng.num_free_blocks == eng.num_blocks, "blocks still held after finish")
