"""SPLITK: split-KV decode is NaN-free for every split size and equals the unsplit result (LOGIT rule)."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import gc
import random

import hypothesis.strategies as st
import pytest

from conformance import cases
from conformance.harness import GenerateCache, Tally, compare_with_regen, kernels_of, require_share
from conformance.kernel_checks import check_partials_and_merge, check_split_decode, kv_specs, run_examples
from conformance.tolerance import MIN_COMPARED_SHARE

pytestmark = pytest.mark.clause("SPLITK")


@pytest.mark.kernel_api
def test_every_split_size(conf, scale, model):
    """One batch (lengths 0, 1, on and around block boundaries; stale NaN pages; shuffled pages) decoded with every
    split size from 1 to beyond the longest sequence, and unsplit (None)."""
    case = conf.case(model, "SPLITK")
    kern = kernels_of(case.engine())
    bs = case.block_size
    cfg = case.cfg
    lens = (0, 1, bs - 1 if bs > 1 else 2, bs, bs + 1, 3 * bs + 2)
    spec = cases.KVSpec(seed=7, n_q=cfg.num_attention_heads, n_kv=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                        block_size=bs, lens=lens, extra_pages=2)
    sizes = list(range(1, max(lens) + 3)) + [None]
    n = check_split_decode(case, kern, spec, sizes)
    conf.note(f"[SPLITK] {model}: {n} split sizes x {len(lens)} sequences NaN-free and within the LOGIT rule")


@pytest.mark.kernel_api
def test_split_decode_cases(conf, scale, model):
    """Hypothesis: random batches (empty sequences, boundaries, GQA of the shape, NaN stale pages) x split sizes
    (1, below / at / above the block size, more splits than blocks, beyond the sequence)."""
    case = conf.case(model, "SPLITK")
    kern = kernels_of(case.engine())
    bs = case.block_size
    sizes = st.lists(st.one_of(st.integers(1, 6 * bs + 4), st.sampled_from([1, bs, bs + 1, max(1, bs - 1), None])),
                     min_size=1, max_size=4, unique=True)
    run_examples(scale.examples, st.tuples(kv_specs(case), sizes),
                 lambda x: check_split_decode(case, kern, x[0], x[1]))


@pytest.mark.kernel_api
def test_partials_empty_splits_and_merge(conf, scale, model):
    """split_kv_partials with more splits than needed: empty splits are o = 0, lse = -inf exactly; the others match
    the oracle's partial states; merge_states of the shuffled partials equals the unsplit oracle, NaN-free."""
    case = conf.case(model, "SPLITK")
    kern = kernels_of(case.engine())
    bs = case.block_size
    run_examples(max(4, scale.examples // 2),
                 st.tuples(kv_specs(case, 4), st.integers(1, 3 * bs + 1), st.integers(0, 3)),
                 lambda x: check_partials_and_merge(case, kern, x[0], x[1], x[2]))


def test_policy_reported_and_tokens_agree(conf, scale, model):
    """Engine level: every TurnOutput reports the split-KV policy in force and the split size of each decode step;
    greedy tokens under disabled / fixed:1 / fixed:(bs+1) / auto agree with the unsplit engine's generate."""
    case = conf.case(model, "SPLITK")
    bs = case.block_size
    rng = random.Random(51)
    prompts = [cases.random_tokens(rng, case.cfg.vocab_size, n) for n in (1, bs, 2 * bs + 3)]
    sp = case.sp(temperature=0.0, max_tokens=2 * bs + 3, stop_token_ids=())
    base = case.engine(split_kv="disabled")
    gen = GenerateCache(case, base)
    bound = case.noise(base).bound
    tally = Tally()
    for policy in ("disabled", "fixed:1", f"fixed:{bs + 1}", "auto"):
        eng = case.engine(split_kv=policy)
        with case.guard():
            sids = [eng.rollout_add(p, sp) for p in prompts]
            outs = eng.rollout_run_turns()
        for p, sid in zip(prompts, sids):
            out = outs[sid]
            case.check(out.split_kv == policy, lambda: f"policy {policy!r}: TurnOutput.split_kv is {out.split_kv!r}")
            steps = len(out.token_ids) - 1
            case.check(len(out.split_sizes) == steps, lambda: (
                f"policy {policy!r}: {len(out.split_sizes)} split sizes reported for {steps} decode steps"))
            if policy == "disabled":
                case.check(all(s is None for s in out.split_sizes), lambda: f"disabled policy used splits {out.split_sizes}")
            elif policy.startswith("fixed:"):
                n = int(policy.split(":")[1])
                case.check(all(s == n for s in out.split_sizes), lambda: f"policy {policy!r} used splits {out.split_sizes}")
            else:
                case.check(all(s is None or s >= 1 for s in out.split_sizes), lambda: f"auto used {out.split_sizes}")
            with case.guard():
                ref = gen(p, sp)
            tally.add(compare_with_regen(case, f"policy {policy!r}: prompt of {len(p)} tokens vs unsplit generate",
                                         p, list(out.token_ids), ref, sp, bound, gen))
        del eng, outs                 # one engine at a time besides the base (gigabytes each at the qwen3-8b shape)
        gc.collect()
    require_share(case, tally, "compared", MIN_COMPARED_SHARE, "split policies vs unsplit")
