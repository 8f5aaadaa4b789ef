"""Does an L2 prefetch on a side stream, while latency-bound kernels run, make the next cuBLAS GEMM faster?

    python benches/gpu/probe_prefetch.py [--reps 30] [--out DIR]

Diagnostic (the engine's A/B is ``profile_decode.py --variants default pf-off ...``). For each qwen3-8b
decode GEMM at M = 1 (``torch.matmul``, as the engine runs them) and a *window* that stands for the kernels
between the GEMM before and this one (a ``torch.cuda._sleep`` spin on the main stream of about the
engine's time there: 11 us before o_proj, 3 us before the others; o_proj also with 30 us, time enough for
its whole weight to land), it times, with CUDA events from the
window's start to the GEMM's end, L2 flushed first (a 256 MiB write) and the host a millisecond ahead:

* ``none``: the window, then the GEMM;
* each prefetch variant (kind, chunk bytes, bytes asked): a side stream forked at the window's start
  runs ``ops.l2_prefetch``, the main stream joins it after the window, then the GEMM -- the engine's
  ``_fork_prefetch`` / ``_join``;
* ``warm``: the window, then the GEMM with its whole weight read into L2 just before (another GEMM of the
  same weight ahead of the window): what an L2-resident weight gives.

Also the prefetch kernel's own time on the side stream (how long it holds the join) and the product's
output is checked bitwise against the unprefetched one (a prefetch moves no value).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from optimized import ops  # noqa: E402

MiB = 1 << 20
#: (name, N, K, window in us): the qwen3-8b decode GEMMs and the kernels before each in a batch-1 step
GEMMS = (("o_proj", 4096, 4096, 11.0), ("o_proj", 4096, 4096, 30.0), ("gate_up", 24576, 4096, 3.0),
         ("down", 4096, 12288, 3.0), ("qkv", 6144, 4096, 3.0))
#: (kind, chunk, bytes asked: None = the whole weight, else MiB)
VARIANTS = (("bulk", 16384, None), ("bulk", 4096, None), ("bulk", 65536, None), ("lines", 0, None),
            ("bulk", 16384, 12), ("bulk", 4096, 12), ("lines", 0, 12))


def cycles_per_us() -> float:
    """SM cycles of ``torch.cuda._sleep`` per microsecond (timed once on 2M cycles)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(100_000)
    a.record()
    torch.cuda._sleep(2_000_000)
    b.record()
    torch.cuda.synchronize()
    return 2_000_000 / (a.elapsed_time(b) * 1e3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    cpu = cycles_per_us()
    scratch = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
    main_s, side = torch.cuda.current_stream(dev), torch.cuda.Stream(dev)
    print(f"device {torch.cuda.get_device_name()}, L2 {torch.cuda.get_device_properties(0).L2_cache_size / MiB:.0f} MiB, "
          f"sleep {cpu:.0f} cycles/us; times: median of {args.reps}, us from the window's start to the GEMM's end")
    report: dict = {"cycles_per_us": cpu, "rows": []}
    for name, N, K, window in GEMMS:
        w = torch.randn(N, K, device=dev).to(torch.bfloat16)
        x = torch.randn(1, K, device=dev).to(torch.bfloat16)
        ref = torch.matmul(x, w.t())
        wbytes = w.numel() * 2
        spin = int(window * cpu)

        def timed(variant) -> tuple[float, float]:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            p0, p1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            scratch.zero_()                                     # evict w from L2
            if variant == "warm":
                torch.matmul(x, w.t())
            torch.cuda._sleep(2_000_000)                        # the host runs ahead of the GPU
            e0.record()
            if isinstance(variant, tuple):
                kind, chunk, mib = variant
                side.wait_stream(main_s)
                with torch.cuda.stream(side):
                    p0.record()
                    ops.l2_prefetch(w, wbytes if mib is None else min(wbytes, mib * MiB), kind=kind,
                                    chunk=chunk or ops.L2_PREFETCH_CHUNK)
                    p1.record()
            torch.cuda._sleep(spin)
            if isinstance(variant, tuple):
                main_s.wait_stream(side)
            y = torch.matmul(x, w.t())
            e1.record()
            torch.cuda.synchronize()
            assert torch.equal(y, ref), f"{name}: the product changed under {variant}"
            return e0.elapsed_time(e1) * 1e3, (p0.elapsed_time(p1) * 1e3 if isinstance(variant, tuple) else 0.0)

        floor = wbytes / 4.2e6                                   # us at 4.2 TB/s, for scale
        spin_only = []
        for _ in range(args.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)
            a.record()
            torch.cuda._sleep(spin)
            b.record()
            torch.cuda.synchronize()
            spin_only.append(a.elapsed_time(b) * 1e3)
        print(f"\n{name} ({N} x {K}, {wbytes / MiB:.1f} MiB, {floor:.1f} us at 4.2 TB/s), window {window} us "
              f"(spin measured {statistics.median(spin_only):.1f} us)")
        base = None
        for variant in ("none", "warm") + VARIANTS:
            for _ in range(3):
                timed(variant)
            ts, ps = zip(*(timed(variant) for _ in range(args.reps)))
            t, p = statistics.median(ts), statistics.median(ps)
            base = t if variant == "none" else base
            label = variant if isinstance(variant, str) else \
                f"{variant[0]}{'' if variant[0] == 'lines' else f' {variant[1] // 1024}K'} " \
                f"{'all' if variant[2] is None else f'{variant[2]} MiB'}"
            after = t - statistics.median(spin_only)
            print(f"  {label:>18}: {t:7.1f} us  ({t - base:+6.1f} vs none; GEMM after the window {after:6.1f})"
                  + (f"  prefetch kernel {p:5.1f} us" if p else ""))
            report["rows"].append(dict(gemm=name, N=N, K=K, window_us=window, variant=label, us=t, prefetch_us=p))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_prefetch.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
