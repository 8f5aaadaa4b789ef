#!/usr/bin/env python
"""How the engine lays out a sequence's KV pages in the agentic workload: runs of consecutive pages and 2 MiB regions.

    PYTHONPATH=. python benches/page_layout.py [--turns 1]

The reference engine (it shares the scheduler and the first-in-first-out block manager with the optimized engine) runs
the agentic bench's GPU-scale shape on the CPU with a tiny model: 64 sequences, a 1024-token prompt and a 256-token
observation, turns of 128 greedy tokens, 16-token pages, the bench's pool and its two-turn warm-up first. After each
turn it prints, over the sequences, how many runs of consecutive page numbers a block table has and how many
64-page groups (the 2 MiB regions of qwen3-8b's K cache, 32 KiB a page a layer) it touches, beside the same counts for
pages drawn in one random order (the decode lab's ``shuffled`` problem). Layout only: nothing is timed. A turn takes
one to several minutes on two cores (the reference's attention is plain PyTorch), so ``--turns`` defaults to 1.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference  # noqa: E402
from _bench import model_weights  # noqa: E402
from reference.config import named_config  # noqa: E402
from reference.types import SamplingParams  # noqa: E402
from test_agentic import ENGINE_KW, GEN, SEQS, WARM_GEN, engine_pool, workload_tokens  # noqa: E402

S = "gpu"  # the bench's GPU-scale workload (its model replaced by a tiny one)
REGION = 64  # pages of a 2 MiB region of one layer's K cache at qwen3-8b's shape


def stats(tables: list[list[int]]) -> tuple[float, float]:
    """Mean runs of consecutive page numbers and mean regions touched, over the tables."""
    runs = [1 + sum(1 for a, b in zip(t, t[1:]) if b != a + 1) for t in tables]
    regions = [len({p // REGION for p in t}) for t in tables]
    return sum(runs) / len(runs), sum(regions) / len(regions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=1)
    a = ap.parse_args()
    max_len, num_blocks = engine_pool(S)
    cfg = replace(named_config("tiny"), max_position_embeddings=max_len)
    eng = reference.Engine.from_state_dict(cfg, model_weights(cfg, torch.float32), max_num_seqs=SEQS[S],
                                           max_model_len=max_len, num_blocks=num_blocks, **ENGINE_KW[S])
    prompts, obs = workload_tokens(S, cfg.vocab_size)
    shuffled = list(range(num_blocks))
    random.Random(0).shuffle(shuffled)

    def run(turns: int, gen: int, report: bool) -> None:
        sp = SamplingParams(temperature=0.0, max_tokens=gen, stop_token_ids=())
        sids = [eng.rollout_add(p + o[0], sp) for p, o in zip(prompts, obs)]
        for k in range(turns):
            if k:
                for sid, o in zip(sids, obs):
                    eng.rollout_continue(sid, o[k])
            eng.rollout_run_turns()
            if report:
                tables = [list(eng._seqs[s].block_table) for s in sids]
                n = len(tables[0])
                runs, regions = stats(tables)
                s_runs, s_regions = stats([shuffled[i * n:(i + 1) * n] for i in range(len(tables))])
                print(f"turn {k + 1}: {n} pages a sequence; engine: {runs:.1f} runs, {regions:.1f} regions; "
                      f"shuffled: {s_runs:.1f} runs, {s_regions:.1f} regions", flush=True)
        for sid in sids:
            eng.rollout_finish(sid)

    run(2, WARM_GEN, False)  # the bench's warm-up
    run(a.turns, GEN[S], True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
