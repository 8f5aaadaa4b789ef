"""Where a decode step's warpgroup GEMMs spend their time: per-CTA timestamps inside the engine's graph.

    python benches/gpu/trace_wg.py [--model qwen3-0.6b] [--batch 32] [--prompt 256] [--variants gather spread s4]
                                   [--source FILE]

Diagnostic. Builds ``skinny_wg.cu`` with ``-DTK_WG_TRACE`` (thread 0 of every CTA records ``%globaltimer`` at seven
marks: its start, its consumers' PDL wait passed, its first stage landed, its last unit's MMAs done, the split-K fold
done, its stores done, its end) and makes it the engine's. It then records the third decode step of a greedy
generation, replayed from the step's CUDA graph, once per variant (``gather``: the fold in CTA 0; ``spread``: spread
over the cluster, ``runner.wg_spread_fold``; ``s4``: spread, and the layer GEMMs on their 4-stage configurations
where built, ``runner.wg_stages``). The records are grouped into launches (sorted by the wait mark: a
launch's CTAs pass their wait only after the launch before has ended) and named by role from their shapes. Per role,
medians over the step's layers, in µs:

* ``gap``: the launch's first wait passed less the end of the traced launch before it (the attention runs between
  the qkv and o_proj launches, so o_proj's gap holds it);
* the median CTA's phases: wait -> first stage (x landed), -> the MMAs done, -> the fold done, -> the stores done,
  -> its end;
* ``span``: the first wait passed to the last CTA's end; ``incr``: the last end less the traced launch before's.

A second table gives, per role, the seven marks of the median CTA and of the slowest one (the latest last MMA) as
offsets from the launch's first wait, and each cluster rank's median last MMA. A third (sixty-second session) gives,
for the roles whose CTAs fill each stage once, when the stages landed (the producer's sightings of their full
barriers, after it has issued every copy): per stage the median over CTAs, as offsets from the launch's first wait,
next to the median last MMA. Stages that land long before the last MMA mean the MMAs are slow; stages that land
just before it mean the MMAs wait for them.

``--source FILE`` traces FILE's text in place of the tree's ``skinny_wg.cu`` (its ``#include "x.cuh"`` headers today's),
e.g. a variant of the kernel that a device round writes.

The trace's own stores (one record a CTA, at its end) lengthen each launch slightly; the untraced step time is
``profile_decode.py``'s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches" / "gpu"), str(ROOT / "benches")]

import optimized  # noqa: E402
from ab_attention import build, install  # noqa: E402
from optimized import kernels  # noqa: E402
from _bench import decode_pool  # noqa: E402
from profile_decode import STAGES_VARIANTS  # noqa: E402
from conformance.cases import draw_weights  # noqa: E402
from reference import SamplingParams  # noqa: E402
from reference.config import named_config  # noqa: E402

CAP, COLS = 65536, 18                        # kWgTraceCap, kWgTraceCols in skinny_wg.cu
MARKS = ("start", "wait", "first", "mma", "fold", "store", "end")
PHASES = (("wait>x", 1, 2), ("x>mma", 2, 3), ("mma>fold", 3, 4), ("fold>store", 4, 5), ("store>end", 5, 6))


def role_of(cfg, N: int, K: int, flags: int) -> str:
    """The layer GEMM a record's launch is, from its shape and kind (``wg_trace[r][9]``'s low bits)."""
    epi, f32 = flags >> 8, bool(flags & 32)
    H, D = cfg.hidden_size, cfg.head_dim
    if f32:
        return "lm_head"
    if epi == 1:
        return "gate_up"
    if N == (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * D and K == H:
        return "qkv"
    if N == H and K == cfg.num_attention_heads * D:
        return "o_proj"
    if N == H and K == cfg.intermediate_size:
        return "down"
    return f"N{N}K{K}"


def launches(rows, cfg) -> list[dict]:
    """The records grouped into launches, in the chain's order."""
    rows = sorted(rows, key=lambda r: r[1])
    out, i = [], 0
    while i < len(rows):
        grid, N = rows[i][8] >> 32, rows[i][8] & 0xFFFFFFFF
        group = rows[i:i + grid]
        keys = {(r[8], r[9]) for r in group}
        blocks = {(r[7] >> 8) & 0xFFFFFF for r in group}
        if len(group) != grid or len(keys) != 1 or len(blocks) != grid:
            raise RuntimeError(f"records {i}..{i + grid}: not one launch's CTAs ({len(group)} of {grid}, "
                               f"{len(keys)} shapes, {len(blocks)} blocks)")
        K, flags = rows[i][9] >> 32, rows[i][9] & 0xFFFFFFFF
        out.append(dict(role=role_of(cfg, N, K, flags), grid=grid, spread=bool(flags & 1),
                        t=[[r[k] for r in group] for k in range(7)], rank=[r[7] & 0xFF for r in group],
                        land=[[r[k] for r in group] for k in range(10, COLS)]))
        i += grid
    return out


def one_step(ls: list[dict]) -> list[dict]:
    """The launches of the last whole decode step: after an LM head, up to and including the next one."""
    heads = [i for i, lch in enumerate(ls) if lch["role"] == "lm_head"]
    if not heads:
        raise RuntimeError("no LM head launch recorded")
    lo = heads[-2] + 1 if len(heads) > 1 else 0
    return ls[lo:heads[-1] + 1]


def report(step: list[dict]) -> dict[str, dict[str, float]]:
    per: dict[str, dict[str, list[float]]] = {}
    prev_end = None
    for lch in step:
        t = lch["t"]
        wait0, end = min(t[1]), max(t[6])
        d = per.setdefault(lch["role"], {})
        if prev_end is not None:
            d.setdefault("gap", []).append((wait0 - prev_end) / 1e3)
            d.setdefault("incr", []).append((end - prev_end) / 1e3)
        for name, a, b in PHASES:
            d.setdefault(name, []).append(statistics.median(y - x for x, y in zip(t[a], t[b])) / 1e3)
        d.setdefault("waits", []).append((max(t[1]) - wait0) / 1e3)
        d.setdefault("span", []).append((end - wait0) / 1e3)
        d.setdefault("n", []).append(1.0)
        d.setdefault("grid", []).append(float(lch["grid"]))
        prev_end = end
    return {role: {k: (sum(v) if k == "n" else statistics.median(v)) for k, v in d.items()} for role, d in per.items()}


def tails(step: list[dict]) -> dict[str, dict[str, list[float]]]:
    """Per role, the marks of two CTAs of each launch as offsets from its first wait (µs; medians over the launches):
    the median CTA and the slowest (the latest last MMA, which every peer's fold and the cluster's last barrier
    wait for); then each cluster rank's median last MMA. Where the slowest is late shows what the cluster waits on:
    a late start (placement), a late first stage (x), or slow MMAs (weights)."""
    per: dict[str, dict[str, list[list[float]]]] = {}
    for lch in step:
        t, wait0 = lch["t"], min(lch["t"][1])
        order = sorted(range(lch["grid"]), key=lambda c: t[3][c])
        d = per.setdefault(lch["role"], {})
        for name, c in (("median", order[len(order) // 2]), ("slowest", order[-1])):
            d.setdefault(name, []).append([(t[k][c] - wait0) / 1e3 for k in range(7)])
        ranks = sorted(set(lch["rank"]))
        d.setdefault("mma by rank", []).append(
            [statistics.median((t[3][c] - wait0) / 1e3 for c in range(lch["grid"]) if lch["rank"][c] == r)
             for r in ranks])
    return {role: {k: [statistics.median(col) for col in zip(*v)] for k, v in d.items()} for role, d in per.items()}


def landings(step: list[dict]) -> dict[str, list[float]]:
    """Per role whose CTAs all watched their stages: each watched stage's median landing over the CTAs, then the
    median last MMA, as offsets from the launch's first wait (µs; medians over the launches)."""
    per: dict[str, list[list[float]]] = {}
    for lch in step:
        wait0 = min(lch["t"][1])
        stages = [col for col in lch["land"] if all(col)]
        if not stages:
            continue
        row = [statistics.median((v - wait0) / 1e3 for v in col) for col in stages]
        row.append(statistics.median((v - wait0) / 1e3 for v in lch["t"][3]))
        per.setdefault(lch["role"], []).append(row)
    return {role: [statistics.median(col) for col in zip(*rows)] for role, rows in per.items()
            if len({len(r) for r in rows}) == 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--variants", nargs="*", default=["gather", "spread"], choices=["gather", "spread", "s4"])
    ap.add_argument("--source", type=Path, default=None, metavar="FILE")
    args = ap.parse_args()
    import cupy

    dev = torch.device("cuda", 0)
    cfg = named_config(args.model)
    kernels.load("skinny_wg")                 # the plain build first: its target is what the runner asks for
    text = kernels.source("skinny_wg") if args.source is None else args.source.read_text()
    traced = build(text, ["TK_WG_TRACE"], name="skinny_wg")
    buf = cupy.ndarray((CAP, COLS), dtype=cupy.uint64, memptr=traced.get_global("wg_trace"))
    count = cupy.ndarray((1,), dtype=cupy.uint32, memptr=traced.get_global("wg_trace_n"))
    install(traced, "skinny_wg")
    prompts = [[(b * 131 + i * 7) % cfg.vocab_size for i in range(args.prompt)] for b in range(args.batch)]
    print(f"device {torch.cuda.get_device_name()}; {args.model}, batch {args.batch}, prompt {args.prompt}; "
          f"µs, medians over a decode step's launches of a role (phases: the median CTA's)")
    for variant in args.variants:
        w = draw_weights(cfg, 0, dev)
        eng = optimized.Engine.from_state_dict(cfg, w, device=str(dev), block_size=16,
                                               **decode_pool(args.prompt + 16, args.batch, 16))
        del w
        eng.runner.wg_spread_fold = variant != "gather"
        eng.runner.wg_stages = dict(STAGES_VARIANTS[variant]) if variant in STAGES_VARIANTS else {}
        orig, state = eng._execute, {"decodes": 0, "rows": None}

        def execute(batch, orig=orig, state=state):
            if batch.kind != "decode":
                return orig(batch)
            state["decodes"] += 1
            if state["decodes"] != 3:
                return orig(batch)
            torch.cuda.synchronize()
            count.fill(0)
            cupy.cuda.Device().synchronize()
            res = orig(batch)
            torch.cuda.synchronize()
            n = min(int(count.get()[0]), CAP)
            state["rows"] = [[int(v) for v in r] for r in buf[:n].get()]
            return res
        eng._execute = execute
        eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=()))
        step = one_step(launches(state["rows"], cfg))
        spreads = sum(lch["spread"] for lch in step)
        print(f"\n== {variant}: {len(step)} launches in the step, {spreads} with the spread fold ==")
        cols = ("n", "grid", "gap", *(p[0] for p in PHASES), "waits", "span", "incr")
        print(f"{'role':>8} " + " ".join(f"{c:>10}" for c in cols))
        for role, d in report(step).items():
            print(f"{role:>8} " + " ".join(f"{d.get(c, float('nan')):10.2f}" for c in cols))
        print("   marks from the launch's first wait (median CTA, slowest CTA by its last MMA), and each rank's "
              "median last MMA")
        print(f"{'role':>8} {'cta':>12} " + " ".join(f"{m:>8}" for m in MARKS))
        for role, d in tails(step).items():
            for name in ("median", "slowest", "mma by rank"):
                print(f"{role:>8} {name:>12} " + " ".join(f"{v:8.2f}" for v in d[name]))
        print("   stages landed (the producer's sightings; median CTA per stage), then the median last MMA, from the "
              "launch's first wait")
        for role, row in landings(step).items():
            print(f"{role:>8} " + " ".join(f"{v:8.2f}" for v in row[:-1]) + f"  | mma {row[-1]:8.2f}")
        del eng
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
