"""Does the optimized engine's host side hold more Python objects round after round? (CPU, no GPU needed.)

The engine runs on the stand-in kernels and CUDA-graph API of ``tests/_standin_engine.py`` (the tiny model), rounds of
a trickle workload: 8 sequences, a 40-token prompt and 12-token observation, then two turns whose 7-token observations
are handed over one sequence at a time with 2 engine steps after each, 6 tokens a turn. After each round a full
collection, then the count of objects the garbage collector tracks and tracemalloc's traced bytes; at the end the
allocations that grew most from round 2 to the last.

    python benches/probe_host_objects.py eager     # prefill steps eager (prefill graphs off)
    python benches/probe_host_objects.py graphs    # short prefill steps from graphs (256 tokens; the default)

It does not cover CuPy's and the driver's launch path or the CUDA allocator (the stand-ins replace them), and its
round times on a CPU say nothing about a GPU's.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import _standin_engine as standin  # noqa: E402
from reference import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("eager", "graphs"))
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    factory = standin.optimized_host if args.mode == "graphs" else standin.optimized_host_no_prefill_graphs
    eng = factory("tiny", max_num_seqs=8, max_model_len=512, block_size=8, max_num_batched_tokens=256,
                  num_blocks=8 * 64 + 8)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(40)] for _ in range(8)]
    obs = [[[rng.randrange(3, 512) for _ in range(12)] for _ in range(3)] for _ in range(8)]
    sp = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(), logprobs=True)

    def one_round() -> None:
        sids = [eng.rollout_add(p + o[0], sp) for p, o in zip(prompts, obs)]
        eng.rollout_run_turns()
        for k in range(1, 3):
            for i, sid in enumerate(sids):
                eng.rollout_continue(sid, obs[i][k][:7])
                eng.rollout_run_turns(max_steps=2)
            eng.rollout_run_turns()
        for sid in sids:
            eng.rollout_finish(sid)

    tracemalloc.start(12)
    snaps = []
    for r in range(args.rounds):
        t = time.perf_counter()
        one_round()
        dt = time.perf_counter() - t
        gc.collect()
        snaps.append(tracemalloc.take_snapshot())
        print(f"{args.mode} round {r}: {dt * 1e3:.0f} ms, {len(gc.get_objects())} tracked objects, "
              f"traced {tracemalloc.get_traced_memory()[0] / 1e6:.2f} MB")
    for st in snaps[-1].compare_to(snaps[min(1, len(snaps) - 1)], "traceback")[:5]:
        print(f"+{st.size_diff} B, {st.count_diff:+d} blocks:", " <- ".join(st.traceback.format()[-2:][::-1]).strip())


if __name__ == "__main__":
    main()
