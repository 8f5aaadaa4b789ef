"""The warpgroup GEMM (``ops.skinny_wg``) beside cuBLAS on a model's decode GEMMs at 17-64 rows.

    python benches/gpu/probe_wg.py [--model qwen3-8b] [--ms 32 64] [--reps 20] [--out DIR] [--tag _first]

For each GEMM of ``--model`` (weights beyond the L2: a fresh copy each call) and each row count: µs per call
(best of 3 replays of a CUDA graph of ``--reps`` calls, ``probe_blas.timed``) and GB/s of weights for torch's
matmul on its default cuBLAS path and on its cuBLASLt path (the engine's path at 17-64 rows,
``CudaRunner.decode_blas``), then for every built configuration of the warpgroup kernel that takes the shape.
gate/up is timed as the engine runs it: cuBLAS + ``silu_mul`` against the kernel's SwiGLU epilogue. Before its
timing each configuration's output is compared with torch's: the largest difference is printed (the accuracy
rule itself is ``check_kernels.py --only wg``). The floor: the weight bytes over the copy ceiling measured first.
Calls of one graph follow each other, so the kernel's programmatic-dependent start (its first stages' weights
before the wait) overlaps the call before; cuBLAS's kernels do not wait, and do not overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches" / "gpu"), str(ROOT / "benches")]

from probe_blas import model_gemms, timed  # noqa: E402

from optimized import ops  # noqa: E402


def copy_ceiling() -> float:
    """GB/s (read + write) of a 1 GiB device-to-device copy, best of 5."""
    a = torch.empty(1 << 29, dtype=torch.int16, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(6):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3)
    return 2 * a.numel() * 2 / best / 1e9


@contextlib.contextmanager
def blas(lib: str):
    old = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(lib)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(old)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--ms", nargs="*", type=int, default=[32, 64])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tag", default="", help="inserted into the JSON file's name: probe_wg{TAG}_{MODEL}.json")
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    ceiling = copy_ceiling()
    print(f"device {torch.cuda.get_device_name()}, {ops._num_sms(0)} SMs, copy ceiling {ceiling:.0f} GB/s; "
          f"µs per call (GB/s of weights), weights from DRAM, best of 3 replays of {args.reps} calls")
    rows = []
    for name, N, K, f32 in model_gemms(args.model):
        wbytes = N * K * 2
        copies = max(2, -(-3 * l2 // wbytes))
        ws = [torch.randn(N, K, device=dev).to(torch.bfloat16) for _ in range(copies)]
        odt = torch.float32 if f32 else torch.bfloat16
        act = name == "gate_up"
        floor = wbytes / ceiling / 1e3
        for M in args.ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)

            def mm(i, x=x, ws=ws, f32=f32, act=act):
                w = ws[i % len(ws)]
                if f32:
                    return torch.mm(x, w.t(), out_dtype=torch.float32)
                y = torch.matmul(x, w.t())
                return ops.silu_mul(y) if act else y

            ref = mm(0).float()
            us = {"cublas": timed(mm, args.reps)}
            with blas("cublaslt"):
                us["cublaslt"] = timed(mm, args.reps)
            diffs = {}
            nx = ops.skinny_wg_rows(M)
            for kc, _s, n, wt, kp in ops.SKINNY_WG_CONFIGS:
                if n != nx or K % (64 * kp) or (kp > 1 and (K // kp) % kc):
                    continue

                def wg(i, x=x, ws=ws, wt=wt, kp=kp, act=act, odt=odt):
                    return ops.skinny_wg(x, ws[i % len(ws)], out_dtype=odt, swiglu=act, wt=wt, kp=kp)

                tag = f"t{wt}p{kp}"
                diffs[tag] = float((wg(0).float() - ref).abs().max())
                us[tag] = timed(wg, args.reps)
            best = min((k for k in us if k.startswith("t")), key=us.get, default=None)
            print(f"{name:>8} M={M:<3} floor {floor:6.1f}  " + "  ".join(
                f"{k} {v:6.1f} ({wbytes / v / 1e3:4.0f})" for k, v in us.items())
                  + (f"  | best {best}: {us[best] / min(us['cublas'], us['cublaslt']):.3f}x cuBLAS" if best else "")
                  + "  max|d| " + " ".join(f"{k} {v:.2g}" for k, v in diffs.items()), flush=True)
            rows.append(dict(gemm=name, M=M, N=N, K=K, floor_us=floor, us=us, max_diff=diffs))
        del ws
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"probe_wg{args.tag}_{args.model}.json").write_text(
            json.dumps(dict(copy_ceiling_gbs=ceiling, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
