"""One call each of torch's matmul and of the cluster kernel's configurations on one decode GEMM: the program
``ncu`` profiles (``benches/gpu/h200_cluster_round.sh ncu``).

    python benches/gpu/run_cluster_once.py [--model qwen3-8b] [--gemm gate_up] [--m 32] [--configs 256:3:2:4 512:2:2:4]

Diagnostic. Checks each configuration's output against the matmul's first (max |difference|, printed; the
accuracy rule itself is ``check_kernels.py --only cluster``'s), then runs each once more for the profiler.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches" / "gpu")]

from probe_blas import model_gemms  # noqa: E402

from optimized import ops  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--gemm", default="gate_up")
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--configs", nargs="*", default=["256:3:2:4", "512:2:2:4"])
    args = ap.parse_args()
    _, N, K, f32 = next(g for g in model_gemms(args.model) if g[0] == args.gemm)
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    w = torch.randn(N, K, device=dev).to(torch.bfloat16)
    x = torch.randn(args.m, K, device=dev).to(torch.bfloat16)
    odt = torch.float32 if f32 else torch.bfloat16
    ref = torch.mm(x, w.t(), out_dtype=torch.float32) if f32 else torch.matmul(x, w.t())
    for cfg in args.configs:
        kc, S, tp, C = (int(v) for v in cfg.split(":"))
        out = ops.skinny_cluster(x, w, out_dtype=odt, kc=kc, stages=S, tp=tp, cluster=C)
        torch.cuda.synchronize()
        print(f"{args.model} {args.gemm} M={args.m} {cfg}: max |d| vs matmul "
              f"{(out.float() - ref.float()).abs().max().item():.3g}", flush=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
