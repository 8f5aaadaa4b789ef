"""Batch-invariant decode, A/B in one process: the default engine and the invariant engine on the same weights
(split-KV ``fixed:256`` for both, as ``benches/test_invariant_overhead.py``), the invariant engine in variants:

    python benches/gpu/ab_invariant.py [--models qwen3-0.6b qwen3-8b] [--batches 1 8 32 64] [--steps 48]
                                       [--rounds 3] [--variants ...] [--profile-batches 64] [--timeline-batches 64]
                                       [--out DIR]

* ``default``: the default engine;
* ``inv``: the invariant engine as shipped: ``ops.gemm``'s wide launches copy their first stages' weights before the
  PDL wait for weights of ``ops.GEMM_WIDE_PRE_MIN_ELEMS`` or more, ask one CTA a multiprocessor where the grid asks
  no more (``ops.GEMM_WIDE_ONE_CTA_SMEM``); the gate/up GEMM has its SwiGLU epilogue (``fuse_swiglu``), and up to
  ``ops.GEMM_SWIGLU_LATE_MAX_M`` rows lets the down GEMM be scheduled only as its CTAs exit;
* ``inv-pre-all``, ``inv-pre0``: the weights before the wait in every wide launch, in none (``ops.GEMM_WIDE_PRE``);
* ``inv-early``: every SwiGLU launch lets the down GEMM be scheduled right after its wait;
* ``inv-late``: every SwiGLU launch lets it be scheduled only as its CTAs exit;
* ``inv-apart``: the gate/up GEMM and ``silu_mul`` as two launches;
* ``inv-packed``, ``inv-apart-packed``: ``inv-early`` and ``inv-apart`` with two CTAs of a wide launch on one
  multiprocessor where they fit, even in a grid of at most one a multiprocessor (``GEMM_WIDE_ONE_CTA_SMEM = 0``);
* ``inv-old``: the thirty-fifth session's invariant step (no weights before the wait, two launches, two CTAs a
  multiprocessor where they fit).

Diagnostic, not a benchmark of record (that is ``invariant_overhead``): random bf16 weights, a ``--prompt``-token
prompt a sequence, greedy; the median wall time of a decode step (graph replay, host included) per variant, each
variant with its own captured graphs, the variants alternated over ``--rounds`` rounds. Every variant's tokens must
equal ``inv``'s (the variants change no bit), else the script says so and exits 1. At ``--profile-batches``, one
eagerly launched step of ``default`` and of ``inv`` under ``torch.profiler`` (GPU time per kernel name); at
``--timeline-batches``, one replayed step of the ``--timeline-variants`` (``profile_decode.graph_timeline``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches"), str(Path(__file__).resolve().parent)]

import optimized  # noqa: E402
from optimized import ops  # noqa: E402
from _bench import StepRecorder, decode_pool  # noqa: E402
from conformance.cases import draw_weights  # noqa: E402
from profile_decode import GPU, _params, graph_timeline, kernel_table  # noqa: E402
from reference.config import named_config  # noqa: E402

#: variant -> (engine, fuse_swiglu, the ops attributes it sets; the others keep their defaults)
VARIANTS: dict[str, tuple[str, bool, dict]] = {
    "default": ("default", True, {}),
    "inv": ("invariant", True, {}),
    "inv-pre-all": ("invariant", True, {"GEMM_WIDE_PRE": 1 << 20}),
    "inv-pre0": ("invariant", True, {"GEMM_WIDE_PRE": 0}),
    "inv-early": ("invariant", True, {"GEMM_SWIGLU_LATE_MAX_M": 0}),
    "inv-late": ("invariant", True, {"GEMM_SWIGLU_LATE_MAX_M": 1 << 20}),
    "inv-apart": ("invariant", False, {}),
    "inv-packed": ("invariant", True, {"GEMM_SWIGLU_LATE_MAX_M": 0, "GEMM_WIDE_ONE_CTA_SMEM": 0}),
    "inv-apart-packed": ("invariant", False, {"GEMM_WIDE_ONE_CTA_SMEM": 0}),
    "inv-old": ("invariant", False, {"GEMM_WIDE_PRE": 0, "GEMM_WIDE_ONE_CTA_SMEM": 0}),
}
OPS_DEFAULTS = {k: getattr(ops, k) for _, _, kw in VARIANTS.values() for k in kw}


def run(eng, prompts, steps: int) -> tuple[list[float], list[list[int]]]:
    """Wall seconds of each decode step of a greedy generation of ``steps`` tokens, and the tokens."""
    with StepRecorder(eng, GPU) as rec:
        outs = eng.generate(prompts, _params(steps, None))
    return [d["s"] for d in rec.of("decode")], [list(o) for o in outs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["qwen3-0.6b", "qwen3-8b"])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--profile-batches", nargs="*", type=int, default=[64])
    ap.add_argument("--timeline-batches", nargs="*", type=int, default=[64])
    ap.add_argument("--timeline-variants", nargs="*", choices=tuple(VARIANTS), default=["default", "inv", "inv-apart"])
    ap.add_argument("--variants", nargs="*", choices=tuple(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = GPU.device
    report: dict = {"runs": []}
    bad = 0
    for name in args.models:
        cfg = named_config(name)
        w = draw_weights(cfg, 0, dev)
        pool = decode_pool(args.prompt + args.steps + 8, max(args.batches), 16)
        engines = {mode: optimized.Engine.from_state_dict(cfg, w, device=str(dev), block_size=16, split_kv="fixed:256",
                                                          batch_invariant=mode == "invariant", **pool)
                   for mode in ("default", "invariant")}
        del w
        print(f"\n== {name} ==\n{'batch':>5} {'variant':>10} {'ms/step':>8} {'min':>7} {'max':>7} {'vs default':>10}"
              f"   (median over {args.rounds} alternating rounds of the median of {args.steps} steps)")
        for batch in args.batches:
            prompts = [[(b * 131 + i * 7) % cfg.vocab_size for i in range(args.prompt)] for b in range(batch)]
            graphs: dict[str, dict] = {}
            pools: dict[str, object] = {}

            def use(variant: str, graphs=graphs, pools=pools, engines=engines):
                mode, fuse, settings = VARIANTS[variant]
                eng = engines[mode]
                for k, v in {**OPS_DEFAULTS, **settings}.items():   # read at capture (each variant its own graphs)
                    setattr(ops, k, v)
                eng.runner.fuse_swiglu = fuse
                eng.runner.graphs = graphs.setdefault(variant, {})
                eng.runner.pool = pools.get(variant)
                return eng

            tokens: dict[str, list[list[int]]] = {}
            for variant in args.variants:                      # capture + warm each variant once
                eng = use(variant)
                run(eng, prompts, 4)
                pools[variant] = eng.runner.pool
            times: dict[str, list[float]] = {v: [] for v in args.variants}
            for _ in range(args.rounds):
                for variant in args.variants:
                    dt, toks = run(use(variant), prompts, args.steps)
                    times[variant].append(statistics.median(dt) * 1e3)
                    tokens.setdefault(variant, toks)
            base = statistics.median(times["default"]) if "default" in times else None
            ref = tokens.get("inv")
            for variant in args.variants:
                med = statistics.median(times[variant])
                rel = f"{100 * (med / base - 1):+9.1f}%" if base else ""
                same = ref is None or VARIANTS[variant][0] == "default" or tokens[variant] == ref
                bad += not same
                print(f"{batch:>5} {variant:>10} {med:8.3f} {min(times[variant]):7.3f} {max(times[variant]):7.3f} {rel:>10}"
                      + ("" if same else "   TOKENS DIFFER from inv"))
                report["runs"].append(dict(model=name, batch=batch, variant=variant, step_ms=med,
                                           round_ms=times[variant], same_tokens_as_inv=same))
            if batch in args.timeline_batches:
                for variant in (v for v in args.timeline_variants if v in args.variants):
                    rows, span, gap = graph_timeline(use(variant), prompts)
                    print(f"   graph timeline, {variant}, batch {batch}: {span:.1f} us from the first kernel's start to "
                          f"the last one's end; per kernel: launches, summed duration, summed increment of the end")
                    for k, n, dur, inc in rows[:10]:
                        print(f"     {n:4d}x {dur:9.1f} us {inc:9.1f} us  {k}")
                    report["runs"].append(dict(model=name, batch=batch, variant=variant + " timeline", span_us=span,
                                               kernels=[dict(name=k, launches=n, dur_us=d, inc_us=i)
                                                        for k, n, d, i in rows]))
            for eng in engines.values():
                eng.runner.graphs, eng.runner.pool, eng.runner.fuse_swiglu = {}, None, True
            for k, v in OPS_DEFAULTS.items():
                setattr(ops, k, v)
            graphs.clear()
            pools.clear()
            torch.cuda.synchronize()
            if batch in args.profile_batches:
                for mode, eng in engines.items():
                    rows, total = kernel_table(eng, prompts)
                    print(f"   eager step, {mode}, batch {batch}: kernels sum to {total / 1e3:.3f} ms GPU time "
                          f"({sum(n for _, _, n in rows)} launches)")
                    for k, us, n in rows[:12]:
                        print(f"     {us:9.1f} us  {n:4d}x  {k}")
                    report["runs"].append(dict(model=name, batch=batch, variant=f"eager profile {mode}",
                                               gpu_ms=total / 1e3,
                                               kernels=[dict(name=k, us=us, launches=n) for k, us, n in rows]))
        for eng in engines.values():
            eng.runner.graphs.clear()
        engines.clear()
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab_invariant.json").write_text(json.dumps(report, indent=1))
    print("tokens: every variant as inv's" if not bad else f"tokens: {bad} variant runs DIFFER from inv's")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
