"""PAGED: paged continued prefill (GQA, block boundaries, empty prefix, several sequences with padding rows)."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import pytest

from conformance import cases
from conformance.harness import kernels_of
from conformance.kernel_checks import check_prefill, prefill_specs, run_examples

pytestmark = pytest.mark.clause("PAGED")


def _kv(case, lens, seed=3, **kw):
    cfg = case.cfg
    return cases.KVSpec(seed=seed, n_q=cfg.num_attention_heads, n_kv=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                        block_size=case.block_size, lens=tuple(lens), **kw)


@pytest.mark.kernel_api
def test_empty_prefix(conf, scale, model):
    """Fresh prompts (prefix 0) of 1, bs - 1, bs, bs + 1 and 3 bs + 2 tokens, one launch each and all together."""
    case = conf.case(model, "PAGED")
    kern = kernels_of(case.engine())
    bs = case.block_size
    lens = [n for n in (1, bs - 1, bs, bs + 1, 3 * bs + 2) if n >= 1]
    for n in lens:
        check_prefill(case, kern, cases.PrefillSpec(_kv(case, [n]), (0,), 0))
    check_prefill(case, kern, cases.PrefillSpec(_kv(case, lens, seed=4), tuple(0 for _ in lens), 2))


@pytest.mark.kernel_api
def test_block_boundaries(conf, scale, model):
    """Continued prefill whose cached prefix and new chunk start / end on, just before and just after block
    boundaries (the resume case: [pending] + observation over a cached prefix)."""
    case = conf.case(model, "PAGED")
    kern = kernels_of(case.engine())
    bs = case.block_size
    for k, (prefix, new) in enumerate([(bs, 1), (bs - 1, 1), (bs + 1, bs), (2 * bs, bs), (2 * bs - 1, 2),
                                       (bs, 2 * bs + 1), (3 * bs + 1, bs - 1)]):
        if prefix < 0 or new < 1:
            continue
        check_prefill(case, kern, cases.PrefillSpec(_kv(case, [prefix + new], seed=10 + k), (prefix,), 0))


@pytest.mark.kernel_api
def test_several_sequences_with_padding(conf, scale, model):
    """Hypothesis: 1-4 sequences in one launch, random prefixes (0, boundaries, anywhere), interleaved padding rows
    (q_pos = -1, exact zeros), shuffled pages, NaN in every unwritten slot."""
    case = conf.case(model, "PAGED")
    kern = kernels_of(case.engine())
    run_examples(scale.examples, prefill_specs(case), lambda s: check_prefill(case, kern, s))
