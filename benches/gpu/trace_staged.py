"""Where a staged skinny GEMM launch spends its time: per-CTA timestamps (``%globaltimer``).

    python benches/gpu/trace_staged.py [--configs 2048:2:16:1 1024:3:16:2] [--ms 1] [--reps 3]

Diagnostic. Builds ``skinny_gemm.cu`` with ``-DTK_STAGED_TRACE`` (each CTA of a staged launch records its
start, the end of its consumers' PDL wait, the landing of its first stage, the landing of its last stage
with weights, its end, and its SM) and runs single launches of the qwen3-8b decode GEMMs (weights beyond the L2: a
fresh copy each launch) for each configuration ``KC:S:PL:C``. Prints, in µs from the first CTA's start:
the spread of the CTAs' starts, first stages and ends (min / median / max), the median time from a CTA's
first stage to its last, the launch's span, and the event-timed duration of the same launch untraced.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches" / "gpu"), str(ROOT / "benches")]

from ab_attention import build, install  # noqa: E402
from optimized import kernels, ops  # noqa: E402

GEMMS = (("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 24576, 4096), ("down", 4096, 12288),
         ("lm_head", 151936, 4096))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=["2048:2:16:1", "1024:3:16:2"])
    ap.add_argument("--ms", nargs="*", type=int, default=[1])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import cupy

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    traced = build(kernels.source("skinny_gemm"), ["TK_STAGED_TRACE"], name="skinny_gemm")
    plain = kernels.load("skinny_gemm")
    ptr = traced.get_global("staged_trace")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"device {torch.cuda.get_device_name()}; µs from the first CTA's start (min / median / max over CTAs)")
    for name, N, K in GEMMS:
        copies = max(2, -(-3 * l2 // (N * K * 2)))
        ws = [torch.randn(N, K, device=dev).to(torch.bfloat16) for _ in range(copies)]
        for M in args.ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            for cfg in args.configs:
                kc, S, pl, C = (int(v) for v in cfg.split(":"))
                tiles = -(-N // 16)
                G = ops.skinny_staged_grid(tiles, C, ops._num_sms(0))

                def call(i, kc=kc, S=S, pl=pl, C=C, x=x, ws=ws, N=N):
                    out_dtype = torch.float32 if N > 100000 else torch.bfloat16
                    return ops.skinny_staged(x, ws[i % len(ws)], out_dtype=out_dtype, kc=kc, stages=S, lanes=pl,
                                             ctas_per_sm=C)

                install(plain, "skinny_gemm")
                call(0)
                durs = []
                for r in range(args.reps):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    call(r + 1)
                    b.record()
                    torch.cuda.synchronize()
                    durs.append(a.elapsed_time(b) * 1e3)
                install(traced, "skinny_gemm")
                rows = []
                for r in range(args.reps):
                    call(r + 1)
                    torch.cuda.synchronize()
                    host = cupy.ndarray((4096, 6), dtype=cupy.uint64, memptr=ptr)[:G].get().astype("int64")
                    rows.append(host)
                install(plain, "skinny_gemm")
                for host in rows[-1:]:
                    t0 = host[:, 0].min()
                    rel = (host[:, :5] - t0) / 1e3

                    def mmm(col, rel=rel):
                        v = sorted(rel[:, col].tolist())
                        return f"{v[0]:6.1f} /{statistics.median(v):6.1f} /{v[-1]:6.1f}"

                    stream = statistics.median((rel[:, 3] - rel[:, 2]).tolist())
                    span = rel[:, 4].max()
                    gb = N * K * 2 / 1e9
                    print(f"{name:>8} M={M} {cfg:>13} G={G:4d}: start {mmm(0)}  waited {mmm(1)}  first stage {mmm(2)}  "
                          f"last stage {mmm(3)}  end {mmm(4)}  | first->last {stream:5.1f}  span {span:5.1f} "
                          f"({gb / span * 1e6:5.0f} GB/s)  untraced {min(durs):5.1f} us ({gb / min(durs) * 1e6:5.0f} GB/s)",
                          flush=True)
                    late = sorted(range(G), key=lambda c: -rel[c, 4])[:4]
                    print(f"{'':>8}   latest CTAs (cta, sm, start, first, end): "
                          + ", ".join(f"({c}, {int(host[c, 5])}, {rel[c, 0]:.1f}, {rel[c, 2]:.1f}, {rel[c, 4]:.1f})"
                                      for c in late))
        del ws
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
