#!/usr/bin/env python
"""A/B of a GEMM kernel file against the same file built with other macros, in one process.

    python benches/gpu/ab_gemm.py --base-define TK_CP_ASYNC_CG [--rounds 3] [--reps 20]
    python benches/gpu/ab_gemm.py --module skinny_gemm --new-define TK_SKINNY_LD=1 [--base-define ...]

``--module gemm`` (default): the batch-invariant GEMM, ``ops.gemm``; ``--module skinny_gemm``: the
default engine's decode GEMM, ``ops.skinny_gemm`` (M <= 16 only). ``--new-define`` builds the "new"
side from the tree's file with macros too (default: the tree's build as the engine loads it).

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

from ab_attention import build, install  # noqa: E402
from check_kernels import _time as gpu_seconds  # noqa: E402
from optimized import kernels, ops  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 8, 128, 12288, 151936
SHAPES = {"qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o_proj": (HIDDEN, HEADS * HEAD_DIM),
          "gate_up": (2 * FFN, HIDDEN), "down": (HIDDEN, FFN), "lm_head": (VOCAB, HIDDEN)}
ROWS = (1, 8, 64, 256, 2048)
L2_BYTES = 128 << 20  # comfortably past the H200's 60 MB L2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", choices=("gemm", "skinny_gemm"), default="gemm")
    ap.add_argument("--base-define", nargs="*", default=[], help="macros (-DNAME) the base is compiled with")
    ap.add_argument("--new-define", nargs="*", default=None, help="macros (-DNAME) the new side is compiled with")
    ap.add_argument("--shapes", nargs="*", choices=sorted(SHAPES), default=None, help="only these GEMMs")
    ap.add_argument("--rows", nargs="*", type=int, default=None, help="only these M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    mname = a.module
    tree = kernels.load(mname)
    new = tree if a.new_define is None else build(kernels.source(mname), a.new_define, name=mname)
    base = build(kernels.source(mname), a.base_define, name=mname)
    sides = {"base": base, "new": new}
    op = ops.gemm if mname == "gemm" else ops.skinny_gemm
    rows = a.rows or (ROWS if mname == "gemm" else (1, 8, 16))
    print(f"{mname}: base -D{' -D'.join(a.base_define) or '(none)'}, new "
          f"{'the tree' if a.new_define is None else '-D' + ' -D'.join(a.new_define)}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    for name, (N, K) in SHAPES.items():
        if a.shapes and name not in a.shapes:
            continue
        copies = max(1, -(-L2_BYTES // (N * K * 2)))
        ws = [(torch.randn(N, K, device="cuda", generator=gen) * K ** -0.5).to(torch.bfloat16) for _ in range(copies)]
        for M in rows:
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            out_dtype = torch.float32 if name == "lm_head" else torch.bfloat16
            turn = [0]

            def call(x=x, out_dtype=out_dtype, turn=turn, ws=ws):
                turn[0] += 1
                return op(x, ws[turn[0] % len(ws)], out_dtype=out_dtype)

            outs = {}
            for tag, mod in sides.items():
                install(mod, mname)
                outs[tag] = op(x, ws[0], out_dtype=out_dtype)
            torch.cuda.synchronize()
            same = torch.equal(outs["base"], outs["new"])
            ok &= same
            best = {tag: float("inf") for tag in sides}
            for _ in range(a.rounds):
                for tag, mod in sides.items():
                    install(mod, mname)
                    best[tag] = min(best[tag], gpu_seconds(call, iters=a.reps) * 1e6)
            if mname == "skinny_gemm" and a.rounds:  # cuBLAS on the same product (bf16 out), for scale

                def cublas(x=x, turn=turn, ws=ws):
                    turn[0] += 1
                    return torch.matmul(x, ws[turn[0] % len(ws)].T)

                best["cublas"] = min(gpu_seconds(cublas, iters=a.reps) * 1e6 for _ in range(a.rounds))
            gbs = {tag: N * K * 2 / (us * 1e-6) / 1e9 for tag, us in best.items()}
            tile = ops.gemm_choice(M, N, K) if mname == "gemm" else "skinny"
            print(f"{mname} {name} M={M} N={N} K={K} ({tile}): base {best['base']:.1f} us "
                  f"({gbs['base']:.0f} GB/s of weights), new {best['new']:.1f} us ({gbs['new']:.0f} GB/s), "
                  f"new/base time {best['new'] / best['base']:.3f}, bits {'equal' if same else 'DIFFER'}"
                  + (f", cublas {best['cublas']:.1f} us ({gbs['cublas']:.0f} GB/s)" if "cublas" in best else ""),
                  flush=True)
        del ws
    install(tree, mname)
    print("all outputs bitwise equal to the base" if ok else "SOME OUTPUTS DIFFER FROM THE BASE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
