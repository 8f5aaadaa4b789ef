"""Group prefix sharing (GRPO): n samples of one prompt. With ``rollout_add_group`` the prompt is
prefilled once and its full blocks are shared (reference counted, copied on write); without it,
each sample prefills the whole prompt and holds its own pages.

Checked first: both ways sample the same tokens (the same seeds, the same positions). Reported:
pages in use after the first turn, tokens prefilled, and the wall time of the first turn, at
n = 8 and 16.
"""

from __future__ import annotations

import random

import pytest
import torch

from _bench import Stopwatch, make_engine, model_weights
from reference import SamplingParams, named_config

GROUP = "group_sharing"

# ---------------------------------------------------------------- problem sizes (one table)
MODEL = {"cpu": "tiny", "gpu": "qwen3-0.6b"}
PROMPT = {"cpu": 64, "gpu": 2048}
GEN = {"cpu": 4, "gpu": 64}
GROUPS = {"cpu": 2, "gpu": 8}          # distinct prompts, each sampled n times
N = (8, 16)
BLOCK = 16


@pytest.fixture(scope="module", autouse=True)
def _describe(results):
    results.describe(GROUP, "Group prefix sharing: n samples of one prompt", columns=[
        ("n", "n", ""), ("variant", "variant", ""), ("blocks", "pages in use", ""),
        ("prefilled", "tokens prefilled", ""), ("turn_s", "first turn s", ".3f"),
        ("saved_blocks", "pages saved", ""), ("saved_prefill", "prefill tokens saved", "")],
        plots=[dict(x="n", y="blocks", series="variant", xlabel="samples per prompt", ylabel="pages in use",
                    title="memory with and without prefix sharing")])


@pytest.mark.parametrize("n", N)
def test_group_sharing(n, scale, results):
    s = scale.name
    cfg = named_config(MODEL[s])
    rng = random.Random(n)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(PROMPT[s])] for _ in range(GROUPS[s])]
    sps = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=GEN[s], stop_token_ids=(), seed=i) for i in range(n)]
    weights = model_weights(cfg, torch.bfloat16 if scale.gpu else torch.float32)
    rows = {}
    tokens = {}
    for variant in ("shared", "unshared"):
        total = GROUPS[s] * n * (PROMPT[s] + GEN[s] + BLOCK)
        eng = make_engine(scale, cfg, weights, block_size=BLOCK, max_num_seqs=GROUPS[s] * n,
                          max_model_len=PROMPT[s] + GEN[s] + BLOCK, num_blocks=total // BLOCK + 8,
                          max_num_batched_tokens=max(2048, PROMPT[s]))
        if variant == "shared":
            sids = [sid for p in prompts for sid in eng.rollout_add_group(p, sps)]
        else:
            sids = [eng.rollout_add(p, sp) for p in prompts for sp in sps]
        with Stopwatch(scale) as sw:
            outs = eng.rollout_run_turns()
        tokens[variant] = [outs[x].token_ids for x in sids]
        rows[variant] = dict(blocks=eng.num_blocks - eng.num_free_blocks,
                             prefilled=sum(outs[x].prefilled_tokens for x in sids), turn_s=sw.wall_s)
        for x in sids:
            eng.rollout_finish(x)
        assert eng.num_free_blocks == eng.num_blocks, f"{variant}: pages leaked"
    same = sum(a == b for a, b in zip(tokens["shared"], tokens["unshared"]))
    assert same >= 0.9 * len(tokens["shared"]), f"sharing changed the samples: {same}/{len(tokens['shared'])} equal"
    saved_blocks = rows["unshared"]["blocks"] - rows["shared"]["blocks"]
    saved_prefill = rows["unshared"]["prefilled"] - rows["shared"]["prefilled"]
    assert saved_blocks > 0 and saved_prefill > 0
    for variant, r in rows.items():
        results.add(GROUP, n=n, variant=variant, saved_blocks=saved_blocks if variant == "shared" else 0,
                    saved_prefill=saved_prefill if variant == "shared" else 0, **r)
    results.note(GROUP, f"n={n}: identical samples {same}/{len(tokens['shared'])}; pages saved {saved_blocks}, "
                        f"prefill tokens saved {saved_prefill}, first turn "
                        f"{rows['unshared']['turn_s'] / rows['shared']['turn_s']:.2f}x faster shared")
