"""Where a decode step's time goes: per-kernel GPU time of one step, and the step time of the
captured graph with each launch fusion / GEMM path switched on and off (A/B on one engine).

    python benches/gpu/profile_decode.py [--models qwen3-0.6b qwen3-8b] [--batches 1 8 16 32 64]
                                         [--steps 48] [--out DIR]

Diagnostic, not a benchmark of record (the numbers of record are ``benches/test_engine_decode.py``):
random bf16 weights drawn on the GPU (``conformance.cases.draw_weights``; values do not change the work), a 256-token prompt per
sequence, greedy decoding of ``--steps`` tokens. For each (model, batch):

* the median wall time of a decode step (graph replay, host side included) for the variants
  ``cuBLAS`` (every GEMM through ``torch.matmul``) and ``skinny`` (GEMMs of <= 16 rows through
  ``ops.skinny_gemm``, the engine default), with the memory floor (weight + KV bytes over the copy
  ceiling measured here) and the % of it;
* one eagerly launched step under ``torch.profiler``: the GPU time per kernel name (summed over
  layers) and the number of launches, so the sum of kernel times can be set against the step time
  (the rest is launch gaps and the host).

Prints tables; with ``--out`` also writes ``profile_decode.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches")]

import optimized  # noqa: E402
from _bench import Scale, StepRecorder, decode_pool, kv_bytes_per_token, weight_bytes_per_step  # noqa: E402
from _ceilings import measure_ceilings  # noqa: E402
from conformance.cases import draw_weights  # noqa: E402
from reference import SamplingParams  # noqa: E402
from reference.config import named_config  # noqa: E402

PROMPT = 256
GPU = Scale("gpu")


def step_times(eng, prompts, steps) -> list[float]:
    """Wall seconds of each decode step of a greedy generation of ``steps`` tokens."""
    with StepRecorder(eng, GPU) as rec:
        eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=steps, stop_token_ids=()))
    return [d["s"] for d in rec.of("decode")]


def kernel_table(eng, prompts) -> tuple[list[tuple[str, float, int]], float]:
    """(kernel name, GPU us per step, launches) of one eagerly launched decode step, and the total."""
    from torch.profiler import ProfilerActivity, profile
    r = eng.runner
    orig = eng._execute
    state: dict = {"decodes": 0, "prof": None}

    def execute(batch):
        if batch.kind != "decode":
            return orig(batch)
        state["decodes"] += 1
        if state["decodes"] != 3:                      # the third decode step: warm, full batch
            return orig(batch)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            res = orig(batch)
            torch.cuda.synchronize()
        state["prof"] = prof
        return res
    r.use_graphs, eng._execute = False, execute
    try:
        eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=()))
    finally:
        r.use_graphs, eng._execute = True, orig
    agg: dict[str, list[float]] = {}
    for ev in state["prof"].events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            a = agg.setdefault(ev.name, [0.0, 0])
            a[0] += getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0)
            a[1] += 1
    rows = sorted(((k[:70], v[0], int(v[1])) for k, v in agg.items()), key=lambda t: -t[1])
    return rows, sum(v for _, v, _ in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["qwen3-0.6b", "qwen3-8b"])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8, 16, 32, 64])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--profile-batches", nargs="*", type=int, default=[1, 32])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = GPU.device
    ceiling = measure_ceilings(GPU)["copy_GBps"]
    print(f"device {torch.cuda.get_device_name()}, copy ceiling {ceiling:.0f} GB/s")
    report: dict = {"copy_GBps": ceiling, "runs": []}
    for name in args.models:
        cfg = named_config(name)
        w = draw_weights(cfg, 0, dev)
        wbytes, kv_tok = weight_bytes_per_step(cfg), kv_bytes_per_token(cfg)
        eng = optimized.Engine.from_state_dict(cfg, w, device=str(dev), block_size=16,
                                               **decode_pool(PROMPT + args.steps + 8, max(args.batches), 16))
        del w
        print(f"\n== {name} ==  weights {wbytes / 1e9:.2f} GB/step, KV {kv_tok} B/token")
        print(f"{'batch':>5} {'variant':>8} {'ms/step':>8} {'p90':>7} {'floor ms':>8} {'% floor':>7}")
        for batch in args.batches:
            prompts = [[(b * 131 + i * 7) % cfg.vocab_size for i in range(PROMPT)] for b in range(batch)]
            ctx = PROMPT + args.steps / 2
            floor = (wbytes + batch * ctx * kv_tok) / (ceiling * 1e9) * 1e3
            for variant, mm in (("cuBLAS", 0), ("skinny", optimized.ops.SKINNY_MAX_M)):
                eng.runner.skinny_max_m = mm
                eng.runner.graphs.clear()
                eng.runner.pool = None                        # a fresh graph pool for the new captures
                step_times(eng, prompts, 4)                   # capture + warm
                ts = step_times(eng, prompts, args.steps)
                med = statistics.median(ts) * 1e3
                p90 = sorted(ts)[int(0.9 * len(ts))] * 1e3
                print(f"{batch:>5} {variant:>8} {med:8.3f} {p90:7.3f} {floor:8.3f} {100 * floor / med:7.1f}")
                report["runs"].append(dict(model=name, batch=batch, variant=variant, step_ms=med, p90_ms=p90,
                                           floor_ms=floor, pct_floor=100 * floor / med))
            if batch in args.profile_batches:
                rows, total = kernel_table(eng, prompts)
                print(f"   eager step at batch {batch}: kernels sum to {total / 1e3:.3f} ms GPU time "
                      f"({sum(n for _, _, n in rows)} launches)")
                for k, us, n in rows[:14]:
                    print(f"     {us:9.1f} us  {n:4d}x  {k}")
                report["runs"].append(dict(model=name, batch=batch, variant="eager profile", gpu_ms=total / 1e3,
                                           kernels=[dict(name=k, us=us, launches=n) for k, us, n in rows]))
        eng.runner.graphs.clear()
        del eng
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_decode.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
