"""LOGIT: teacher-forced ``engine.score(ids)`` against the fp32 Hugging Face oracle, by the flash-attention rule."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import random

import pytest
import torch

from conformance import cases, oracles
from conformance.harness import dtype_of
from conformance.tolerance import ErrorStats, RuleCheck

pytestmark = pytest.mark.clause("LOGIT")


def _ids(case, rng: random.Random, scale) -> list[list[int]]:
    bs = case.block_size
    V = case.cfg.vocab_size
    lens = [1, bs, bs + 1, 3 * bs - 1, max(scale.probe_len, 4 * bs + 3)]
    return [cases.random_tokens(rng, V, n) for n in lens]


def test_score_matches_hf_oracle(conf, scale, model):
    """score(ids) is float32 [T, V] on the CPU and obeys the LOGIT rule against HF Qwen3ForCausalLM (max and mean)."""
    case = conf.case(model, "LOGIT")
    eng = case.engine()
    dtype = dtype_of(eng)
    rng = random.Random(101)
    for ids in _ids(case, rng, scale):
        with case.guard():
            got = eng.score(ids)
        case.check(isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.device.type == "cpu"
                   and tuple(got.shape) == (len(ids), case.cfg.vocab_size), lambda: (
                       f"score must return float32 [T={len(ids)}, V={case.cfg.vocab_size}] on the CPU, got "
                       f"{getattr(got, 'dtype', type(got))} {tuple(getattr(got, 'shape', ()))} on {getattr(got, 'device', '?')}"))
        case.check(bool(torch.isfinite(got).all()), f"score of {len(ids)} tokens has non-finite logits")
        oracle = oracles.hf_logits(model, ids)
        ref = oracles.reference_scorer(model, oracles.dtype_name(dtype), case.block_size).score(ids)
        rule = RuleCheck.of(ErrorStats.of(got, oracle), ErrorStats.of(ref, oracle), dtype)
        conf.note(f"[LOGIT] {model} T={len(ids)}: {rule.describe()}")
        case.check(rule.ok, lambda: f"score({len(ids)} tokens) vs the fp32 HF oracle: {rule.describe()}")


def test_prefix_scores_like_whole(conf, scale, model):
    """score(ids[:k]) equals the first k rows of score(ids) within the LOGIT rule (positions and caching are per call)."""
    case = conf.case(model, "LOGIT")
    eng = case.engine()
    dtype = dtype_of(eng)
    rng = random.Random(202)
    bs = case.block_size
    ids = cases.random_tokens(rng, case.cfg.vocab_size, 4 * bs + 2)
    with case.guard():
        full = eng.score(ids)
    ref_full = oracles.reference_scorer(model, oracles.dtype_name(dtype), bs).score(ids)
    for k in (1, bs, 2 * bs + 1):
        with case.guard():
            part = eng.score(ids[:k])
        oracle = oracles.hf_logits(model, ids[:k])
        ref = oracles.reference_scorer(model, oracles.dtype_name(dtype), bs).score(ids[:k])
        # both the prefix call and the rows of the whole call must obey the rule against the oracle
        for what, x, base in (("score(ids[:k])", part, ref), ("score(ids)[:k]", full[:k], ref_full[:k])):
            rule = RuleCheck.of(ErrorStats.of(x, oracle), ErrorStats.of(base, oracle), dtype)
            case.check(rule.ok, lambda: f"{what} with k={k}: {rule.describe()}")
