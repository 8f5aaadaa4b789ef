#!/usr/bin/env python
"""A/B of the batch-invariant GEMM (``gemm.cu``) against the same file built with macros, in one process.

    python benches/gpu/ab_gemm.py --base-define TK_CP_ASYNC_CG [--rounds 3] [--reps 20]

For the GEMMs of a qwen3-8b step (fused qkv, o_proj, fused gate_up, down_proj, the LM head) at
``M`` = 1, 8, 64, 256 and 2048 rows, ``ops.gemm`` runs with the tree's ``gemm.cu`` ("new") and with the
same source compiled with ``-DNAME`` for each ``--base-define`` ("base"). It checks that both give the
same bits (a cache hint must not change a product), then times both, alternated over ``--rounds``
rounds (``--reps`` calls in one CUDA graph, cycling over copies of the weight that together exceed
the L2), and prints each side's best round, the weight-read rate and the ratio. Exits non-zero when
any output differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import torch  # noqa: E402

from check_kernels import _time as gpu_seconds  # noqa: E402
from optimized import kernels, ops  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 8, 128, 12288, 151936
SHAPES = {"qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o_proj": (HIDDEN, HEADS * HEAD_DIM),
          "gate_up": (2 * FFN, HIDDEN), "down": (HIDDEN, FFN), "lm_head": (VOCAB, HIDDEN)}
ROWS = (1, 8, 64, 256, 2048)
L2_BYTES = 128 << 20  # comfortably past the H200's 60 MB L2


def install(mod) -> None:
    """Make ``mod`` the gemm module ``optimized.ops`` launches from (on the current device)."""
    import cupy

    kernels._modules[("gemm", cupy.cuda.Device().id)] = mod
    for key in [k for k in ops._functions if k[1] == "gemm"]:
        del ops._functions[key]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-define", nargs="+", required=True, help="macros (-DNAME) the base is compiled with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import cupy

    new = kernels.load("gemm")
    base = cupy.RawModule(code=kernels.source("gemm"),
                          options=tuple(kernels.OPTIONS) + tuple(f"-D{d}" for d in a.base_define))
    base.compile()
    sides = {"base": base, "new": new}
    gen = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    for name, (N, K) in SHAPES.items():
        copies = max(1, -(-L2_BYTES // (N * K * 2)))
        ws = [(torch.randn(N, K, device="cuda", generator=gen) * K ** -0.5).to(torch.bfloat16) for _ in range(copies)]
        for M in ROWS:
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            out_dtype = torch.float32 if name == "lm_head" else torch.bfloat16
            turn = [0]

            def call(x=x, out_dtype=out_dtype, turn=turn, ws=ws):
                turn[0] += 1
                return ops.gemm(x, ws[turn[0] % len(ws)], out_dtype=out_dtype)

            outs = {}
            for tag, mod in sides.items():
                install(mod)
                outs[tag] = ops.gemm(x, ws[0], out_dtype=out_dtype)
            torch.cuda.synchronize()
            same = torch.equal(outs["base"], outs["new"])
            ok &= same
            best = {tag: float("inf") for tag in sides}
            for _ in range(a.rounds):
                for tag, mod in sides.items():
                    install(mod)
                    best[tag] = min(best[tag], gpu_seconds(call, iters=a.reps) * 1e6)
            gbs = {tag: N * K * 2 / (us * 1e-6) / 1e9 for tag, us in best.items()}
            print(f"gemm {name} M={M} N={N} K={K} ({ops.gemm_choice(M, N, K)}): base {best['base']:.1f} us "
                  f"({gbs['base']:.0f} GB/s of weights), new {best['new']:.1f} us ({gbs['new']:.0f} GB/s), "
                  f"new/base time {best['new'] / best['base']:.3f}, bits {'equal' if same else 'DIFFER'}", flush=True)
        del ws
    install(new)
    print("all outputs bitwise equal to the base" if ok else "SOME OUTPUTS DIFFER FROM THE BASE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
