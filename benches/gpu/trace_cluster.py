"""Where a cluster GEMM launch (``ops.skinny_cluster``) spends its time: capacity, grid and per-CTA timestamps.

    python benches/gpu/trace_cluster.py [--model qwen3-0.6b] [--ms 32 64] [--reps 20] [--out DIR] [--tag _tma]

Diagnostic. Prints the driver's cluster capacity (``cuOccupancyMaxActiveClusters``) and the grid each launch
got, then, for each GEMM of ``--model`` (weights beyond the L2: a fresh copy each launch) and each built
configuration:

* the time of a call (µs, best of 3 replays of a graph of ``--reps`` calls, as ``probe_blas.py``) for torch's
  matmul and for the cluster kernel as the engine builds it, after its output was compared bitwise with the
  traced build's (the same sums). (The twenty-first session's first version, which copied one row a copy, had
  two more builds here: ``local-x``, each CTA copying all of x itself, and ``local``, with a stage's "empty"
  barrier counting this CTA's consumers only; ``h200/trace_cluster_*.log`` of that call);
* from a traced build of the default kernel (``-DTK_CLUSTER_TRACE``), one launch's per-CTA timeline in µs
  from the first CTA's start (min / median / max over CTAs): start, past the first cluster barrier, past the
  consumers' PDL wait, first stage landed, last stage consumed, end; the distinct SMs used; and per stage,
  median over CTAs and stages: the copies' flight (issue -> landed), the stage's turnaround (landed -> its
  next issue, which waits for the whole cluster to consume it) and the period between landings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches" / "gpu"), str(ROOT / "benches")]

from ab_attention import build, install  # noqa: E402
from probe_blas import model_gemms, timed  # noqa: E402

from optimized import kernels, ops  # noqa: E402

BUILDS = {"default": ()}


def mmm(vals: list[float]) -> str:
    v = sorted(vals)
    return f"{v[0]:6.1f} /{statistics.median(v):6.1f} /{v[-1]:6.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--ms", nargs="*", type=int, default=[32, 64])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tag", default="", help="inserted into the JSON file's name: trace_cluster{TAG}_{MODEL}.json")
    args = ap.parse_args()
    import cupy

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    src = kernels.source("skinny_gemm")
    mods = {tag: build(src, d, name="skinny_gemm") for tag, d in BUILDS.items()}
    traced = build(src, ["TK_CLUSTER_TRACE"], name="skinny_gemm")
    plain = kernels.load("skinny_gemm")
    marks = traced.get_global("cluster_trace")
    stages = traced.get_global("cluster_stage_trace")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = ops._num_sms(0)
    print(f"device {torch.cuda.get_device_name()}, {sms} SMs; µs per call (GB/s of weights), weights from DRAM")
    rows = []
    ok = True
    for name, N, K, f32 in model_gemms(args.model):
        wbytes = N * K * 2
        copies = max(2, -(-3 * l2 // wbytes))
        ws = [torch.randn(N, K, device=dev).to(torch.bfloat16) for _ in range(copies)]
        odt = torch.float32 if f32 else torch.bfloat16
        for M in args.ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)

            def mm(i, x=x, ws=ws, f32=f32):
                w = ws[i % len(ws)]
                return torch.mm(x, w.t(), out_dtype=torch.float32) if f32 else torch.matmul(x, w.t())

            mat_us = timed(mm, args.reps)
            head = f"{name:>8} M={M:<3} matmul {mat_us:6.1f} ({wbytes / mat_us / 1e3:4.0f})"
            for kc, S, tp, C, W in ([c + (4,) for c in ops.SKINNY_CLUSTER_CONFIGS]
                                    + [c + (8,) for c in ops.SKINNY_CLUSTER_W8]):
                def cl(i, x=x, ws=ws, kc=kc, S=S, tp=tp, C=C, W=W, odt=odt):
                    return ops.skinny_cluster(x, ws[i % len(ws)], out_dtype=odt, kc=kc, stages=S, tp=tp, cluster=C,
                                              pre=S, warps=W)
                cfg = f"k{kc}s{S}t{tp}c{C}" + ("w8" if W == 8 else "")
                outs, us = {}, {}
                for tag in BUILDS:
                    install(mods[tag], "skinny_gemm")
                    ops._cluster_capacity.clear()
                    outs[tag] = cl(0).clone()
                    us[tag] = timed(cl, args.reps)
                cap = next(iter(ops._cluster_capacity.values()))
                tiles = (N + 15) // 16
                units = (tiles + tp - 1) // tp
                grid = ops.skinny_cluster_grid(units, C, cap)
                # the traced build: the same bits, then one traced launch
                install(traced, "skinny_gemm")
                ops._cluster_capacity.clear()
                bits = torch.int32 if f32 else torch.int16
                same = all(torch.equal(cl(0).view(bits), o.view(bits)) for o in outs.values())
                ok &= same
                diff = (outs["default"].float() - mm(0).float()).abs().max().item()
                line = (f"{head} | {cfg} cap {cap} grid {grid} units {units}: "
                        + "  ".join(f"{t} {v:6.1f} ({wbytes / v / 1e3:4.0f})" for t, v in us.items())
                        + f" max|d| vs matmul {diff:.2g}" + ("" if same else "  BITS DIFFER (traced build)"))
                cl(1)
                torch.cuda.synchronize()
                cl(2)
                torch.cuda.synchronize()
                n = min(grid, 1024)
                mk = cupy.ndarray((1024, 8), dtype=cupy.uint64, memptr=marks)[:n].get().astype("int64")
                st = cupy.ndarray((1024, 64, 2), dtype=cupy.uint64, memptr=stages)[:n].get().astype("int64")
                install(plain, "skinny_gemm")
                t0 = mk[:, 0].min()
                rel = (mk[:, :6] - t0) / 1e3
                kch = -(-K // kc)
                total = min(64, -(-units // grid) * kch)
                flight, turn, period = [], [], []
                for c in range(n):
                    iss, land = st[c, :total, 0], st[c, :total, 1]
                    flight += [(land[i] - iss[i]) / 1e3 for i in range(total)]
                    turn += [(iss[i + S] - land[i]) / 1e3 for i in range(total - S)]
                    period += [(land[i + 1] - land[i]) / 1e3 for i in range(total - 1)]
                med = {k: statistics.median(v) if v else float("nan")
                       for k, v in (("flight", flight), ("turn", turn), ("period", period))}
                span = rel[:, 5].max()
                print(line, flush=True)
                print(f"{'':>8}   trace {cfg}: start {mmm(rel[:, 0].tolist())}  clustered {mmm(rel[:, 1].tolist())}  "
                      f"waited {mmm(rel[:, 2].tolist())}  first {mmm(rel[:, 3].tolist())}  "
                      f"last {mmm(rel[:, 4].tolist())}  end {mmm(rel[:, 5].tolist())}  span {span:6.1f}  "
                      f"SMs {len(set(mk[:, 6].tolist()))}  stages/CTA {total}  flight {med['flight']:5.2f}  "
                      f"turnaround {med['turn']:5.2f}  period {med['period']:5.2f}", flush=True)
                rows.append(dict(gemm=name, M=M, config=cfg, capacity=cap, grid=grid, units=units, bits_equal=same,
                                 max_diff_vs_matmul=diff,
                                 matmul_us=mat_us, us=us, span_us=float(span),
                                 sms=len(set(mk[:, 6].tolist())), stages_per_cta=total, **{f"{k}_us": v for k, v in med.items()}))
        del ws
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"trace_cluster{args.tag}_{args.model}.json").write_text(json.dumps(rows, indent=1))
    print("bits: traced build == default build everywhere" if ok else "bits: THE TRACED BUILD DIFFERS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
