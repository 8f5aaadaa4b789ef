"""Where a decode step's time goes: per-kernel GPU time of one step, and the step time of the
captured graph with each launch fusion / GEMM path switched on and off (A/B on one engine).

    python benches/gpu/profile_decode.py [--models qwen3-0.6b qwen3-8b] [--batches 1 8 16 32 64]
                                         [--steps 48] [--out DIR]

Diagnostic, not a benchmark of record (the numbers of record are ``benches/test_engine_decode.py``):
random bf16 weights drawn on the GPU (values do not change the work), a 256-token prompt per
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
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import optimized  # noqa: E402
from reference import SamplingParams  # noqa: E402
from reference.config import named_config  # noqa: E402
from reference.weights import expected_shapes  # noqa: E402

PROMPT = 256


def gpu_weights(cfg, dev) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=dev).manual_seed(0)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.bfloat16, device=dev)
        else:
            out[name] = (torch.randn(shape, generator=g, device=dev) * 0.02).to(torch.bfloat16)
    return out


def copy_ceiling_GBps(dev) -> float:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    return 2 * n * 10 / (s.elapsed_time(e) / 1e3) / 1e9


def step_times(eng, prompts, steps) -> list[float]:
    times: list[float] = []
    orig = eng._step

    def timed():
        t0 = time.perf_counter()
        orig()
        times.append(time.perf_counter() - t0)
    eng._step = timed
    try:
        eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=steps, stop_token_ids=()))
    finally:
        eng._step = orig
    return times[1:]                      # the first step is the prefill


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
    dev = torch.device("cuda", torch.cuda.current_device())
    ceiling = copy_ceiling_GBps(dev)
    print(f"device {torch.cuda.get_device_name()}, copy ceiling {ceiling:.0f} GB/s")
    report: dict = {"copy_GBps": ceiling, "runs": []}
    for name in args.models:
        cfg = named_config(name)
        w = gpu_weights(cfg, dev)
        shapes = expected_shapes(cfg)
        wbytes = 2 * sum(math.prod(s) for k, s in shapes.items() if k != "model.embed_tokens.weight")
        if cfg.tie_word_embeddings:
            wbytes += 2 * cfg.vocab_size * cfg.hidden_size
        kv_tok = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
        B = max(args.batches)
        per_seq = -(-(PROMPT + args.steps + 8) // 16)
        eng = optimized.Engine.from_state_dict(cfg, w, device=str(dev), block_size=16, max_num_seqs=B,
                                               max_model_len=per_seq * 16, num_blocks=B * per_seq + 8)
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
