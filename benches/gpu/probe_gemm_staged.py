#!/usr/bin/env python
"""The batch-invariant GEMM's kernels at decode rows, in one process: which is fastest, and how far from cuBLAS.

    python benches/gpu/probe_gemm_staged.py [--models qwen3-8b qwen3-0.6b] [--rows 1 8 16 32] [--rounds 3]
                                            [--reps 20] [--json OUT.json]

For each GEMM of a decode step (fused qkv, o_proj, fused gate/up, down, the LM head, fp32 out) of each model and
each M, every ``ops.gemm`` kernel that takes M rows -- the split and folding tiles (``GEMM_TILES``), the staged
kernels (``GEMM_STAGED``) and the wide ones (``GEMM_WIDE``, where K is a multiple of 64) -- is first checked bitwise
against the split tile the engine used before the staged kernels (``split_16x64`` / ``split_64x64``, or ``16x32`` /
``64x64`` where the workspace is too large): every one computes the canonical order, so any difference is a bug and
the probe exits non-zero. Then each kernel and cuBLAS (``torch.matmul``, not batch-invariant, for scale) are timed,
alternated over ``--rounds`` rounds: ``--reps`` calls in one CUDA graph, cycling over copies of the weight that
together exceed the L2, best round kept. Printed: microseconds, the weights' read rate, and time over the old
tile's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import torch  # noqa: E402

from check_kernels import _time as gpu_seconds  # noqa: E402
from optimized import ops  # noqa: E402

# (hidden, q heads, kv heads, head dim, ffn, vocab)
MODELS = {"qwen3-8b": (4096, 32, 8, 128, 12288, 151936), "qwen3-0.6b": (1024, 16, 8, 128, 3072, 151936)}
L2_BYTES = 128 << 20  # comfortably past the H200's 60 MB L2


def shapes(model: str) -> dict[str, tuple[int, int]]:
    h, nq, nkv, d, f, v = MODELS[model]
    return {"qkv": ((nq + 2 * nkv) * d, h), "o_proj": (h, nq * d), "gate_up": (2 * f, h), "down": (h, f),
            "lm_head": (v, h)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", choices=sorted(MODELS), default=["qwen3-8b", "qwen3-0.6b"])
    ap.add_argument("--rows", nargs="*", type=int, default=[1, 8, 16, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None, help="write every timing here")
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ok, records = True, []
    for model in a.models:
        for gname, (N, K) in shapes(model).items():
            copies = max(1, -(-L2_BYTES // (N * K * 2)))
            ws = [(torch.randn(N, K, device="cuda", generator=gen) * K ** -0.5).to(torch.bfloat16) for _ in range(copies)]
            out_dtype = torch.float32 if gname == "lm_head" else torch.bfloat16
            for M in a.rows:
                x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
                base = ops.gemm_tile(M, N, K)   # the tile gemm_choice took before the staged kernels
                cands = [base] + [t for t, (rows, *_) in ops.GEMM_STAGED.items() if M <= rows] + [
                    t for t, (rows, *_) in ops.GEMM_WIDE.items() if M <= rows and K % 64 == 0]
                ref = ops.gemm(x, ws[0], out_dtype=out_dtype, tile=base)
                same = {}
                for t in cands:
                    same[t] = torch.equal(ops.gemm(x, ws[0], out_dtype=out_dtype, tile=t), ref)
                    ok &= same[t]
                turn = [0]

                def call(tile, x=x, ws=ws, out_dtype=out_dtype, turn=turn):
                    turn[0] += 1
                    return ops.gemm(x, ws[turn[0] % len(ws)], out_dtype=out_dtype, tile=tile)

                def cublas(x=x, ws=ws, turn=turn):
                    turn[0] += 1
                    return torch.matmul(x, ws[turn[0] % len(ws)].T)

                best = {t: float("inf") for t in [*cands, "cublas"]}
                for _ in range(a.rounds):
                    for t in best:
                        fn = cublas if t == "cublas" else (lambda t=t: call(t))
                        best[t] = min(best[t], gpu_seconds(fn, iters=a.reps) * 1e6)
                gbs = {t: N * K * 2 / (us * 1e-6) / 1e9 for t, us in best.items()}
                print(f"{model} {gname} M={M} N={N} K={K}: " + ", ".join(
                    f"{t} {best[t]:.1f} us ({gbs[t]:.0f} GB/s{'' if t == 'cublas' else ', x' + format(best[t] / best[base], '.3f')}"
                    f"{'' if t == 'cublas' or same[t] else ', BITS DIFFER'})" for t in best), flush=True)
                records.append(dict(model=model, gemm=gname, M=M, N=N, K=K, old=base, us=best, gbs=gbs, same=same,
                                    default=ops.gemm_choice(M, N, K)))
            del ws
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))
    print("every kernel bitwise equal to the old tile" if ok else "SOME KERNEL DIFFERS FROM THE OLD TILE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
