#!/usr/bin/env python
"""The agentic workload's engine run with the warp-specialised prefill against the same run on x2, in one process.

    python benches/gpu/ab_agentic_prefill.py [--rounds 3] [--scale gpu|cpu]

The workload of ``benches/test_agentic.py`` (its ``Workload``: 64 sequences, prompt 1024, 8 turns of observation
256 and generation 128 on qwen3-0.6b with random weights, greedy), the engine resuming. Side "ws" is the engine as
it is; side "x2" maps every ``ws`` choice of ``ops.prefill_variant`` to ``x2`` (the engine's kernel before the
twenty-fourth session). Both give the same bits, so the two sides' tokens must be equal (checked, exit 1 if not).
After a warm-up run of each side, the sides alternate over ``--rounds`` rounds; printed per side: the best total
and the per-turn times of its best round, then the ratio. On the CPU (``--scale cpu``, the tiny model) it only
checks that the script runs: there is no ws kernel there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import test_agentic as ta  # noqa: E402
from _bench import Scale  # noqa: E402
from optimized import ops  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    a = ap.parse_args()
    scale = Scale(a.scale)
    w = ta.Workload(scale)
    turns = ta.TURNS[scale.name]
    choose = ops.prefill_variant

    def x2_for_ws(*args, **kw) -> str:
        v = choose(*args, **kw)
        return "x2" if v == "ws" else v

    def run(side: str) -> dict:
        ops.prefill_variant = choose if side == "ws" else x2_for_ws
        try:
            return w.resume(turns, w.sp)
        finally:
            ops.prefill_variant = choose

    best: dict[str, dict] = {}
    tokens: dict[str, list] = {}
    for side in ("ws", "x2"):  # warm-up: graphs, kernels
        tokens[side] = run(side)["tokens"]
    same = tokens["ws"] == tokens["x2"]
    for r in range(a.rounds):
        for side in ("ws", "x2"):
            out = run(side)
            same &= out["tokens"] == tokens["ws"]
            total = sum(out["turn_s"])
            if side not in best or total < best[side]["total"]:
                best[side] = {"total": total, "turn_s": out["turn_s"]}
            print(f"round {r} {side}: {total:.3f} s", flush=True)
    for side, b in best.items():
        print(f"{side}: best {b['total']:.3f} s; turns " + " ".join(f"{t:.3f}" for t in b["turn_s"]))
    print(f"ws / x2 total: {best['ws']['total'] / best['x2']['total']:.3f}")
    print("tokens equal on both sides in every run" if same else "TOKENS DIFFER between the sides")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
