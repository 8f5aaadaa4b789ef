"""Which call of cuBLAS is fastest for a decode step's GEMMs?

    python benches/gpu/probe_blas.py [--reps 20] [--ms 1 8] [--staged 2048:2:16:1 512:3:16:2:2 ...] [--cluster]
        [--swiglu] [--no-lt] [--model qwen3-8b] [--out DIR]

Diagnostic. For the decode GEMMs of ``--model`` (qwen3-8b by default; and the LM head in fp32) at M rows it
times, each from a
CUDA graph of ``--reps`` calls that cycles over copies of the weight that together exceed the L2
(so every call reads its weight from DRAM), best of 3 replays, in one process:

* ``matmul``: ``torch.matmul(x, w.t())``, the engine's call (torch's cuBLAS path);
* ``lt``: the same with ``torch.backends.cuda.preferred_blas_library("cublaslt")`` (torch's own
  cuBLASLt call and heuristic request);
* ``w@xT``: ``torch.matmul(w, x.t())``, the transposed problem (N rows of weights on the M side of the
  library's GEMM; at M = 1 its [N, 1] output read as [1, N] is the same memory);
* ``skinny``: ``ops.skinny_gemm`` (our decode GEMM, M <= 16);
* ``k{KC}s{S}p{PL}x{C}`` (``t{TP}``): ``ops.skinny_staged`` with chunks of KC columns, S stages, PL producer
  lanes, C CTAs a multiprocessor and TP 16-row tiles a stage (``--staged KC:S:PL:C[:TP] ...``), the weights
  through shared memory by bulk copies; each configuration is timed at the rows it is built for (TP = 1 and
  ``ops.SKINNY_STAGED_CONFIGS`` up to 8 rows, ``ops.SKINNY_STAGED_WIDE`` at 9-32);
* ``cl-k{KC}s{S}t{TP}c{C}`` (``--cluster``, at 17-64 rows): ``ops.skinny_cluster`` in every built configuration
  (``ops.SKINNY_CLUSTER_CONFIGS``), x shared by the CTAs of a thread-block cluster.

``--swiglu`` adds the gate/up GEMM with its activation (``gate_up+act``): ``torch.matmul`` then
``ops.silu_mul``, ``ops.skinny_swiglu``, and the staged kernel's SwiGLU epilogue.

Every variant's output is compared with ``matmul``'s (max abs difference printed: the variants may sum
in another order). Prints µs per call and GB/s of weight bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from optimized import ops  # noqa: E402

#: (name, N, K, fp32 output)
GEMMS = (("qkv", 6144, 4096, False), ("o_proj", 4096, 4096, False), ("gate_up", 24576, 4096, False),
         ("down", 4096, 12288, False), ("lm_head", 151936, 4096, True))


def model_gemms(name: str) -> tuple[tuple[str, int, int, bool], ...]:
    """``GEMMS`` of another model's shapes (the runner's fused qkv and gate/up weights)."""
    from reference.config import named_config
    c = named_config(name)
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return (("qkv", q + 2 * kv, c.hidden_size, False), ("o_proj", c.hidden_size, q, False),
            ("gate_up", 2 * c.intermediate_size, c.hidden_size, False),
            ("down", c.hidden_size, c.intermediate_size, False), ("lm_head", c.vocab_size, c.hidden_size, True))


def timed(fn, reps: int) -> float:
    """µs per call: a CUDA graph of ``reps`` calls of ``fn(i)``, best of 3 replays after one warm replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(reps):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    g.replay()
    best = float("inf")
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / reps)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ms", nargs="*", type=int, default=[1, 8])
    ap.add_argument("--staged", nargs="*", default=[], help="staged-kernel configurations KC:STAGES:LANES:CTAS_PER_SM[:TP]")
    ap.add_argument("--swiglu", action="store_true", help="also gate/up with its activation")
    ap.add_argument("--no-lt", action="store_true", help="leave out the cuBLASLt and transposed calls")
    ap.add_argument("--cluster", action="store_true", help="also the cluster kernel at 17-64 rows")
    ap.add_argument("--model", default="qwen3-8b", help="the model whose GEMM shapes are timed")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    staged = [tuple(int(v) for v in c.split(":")) + ((1,) if c.count(":") == 3 else ()) for c in args.staged]
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    lib0 = torch.backends.cuda.preferred_blas_library()
    print(f"device {torch.cuda.get_device_name()}, default BLAS {lib0}; µs per call (GB/s of weights), "
          f"weights from DRAM, best of 3 replays of {args.reps} calls")
    rows = []
    base = GEMMS if args.model == "qwen3-8b" else model_gemms(args.model)
    gu = next(g for g in base if g[0] == "gate_up")
    gemms = base + ((("gate_up+act", gu[1], gu[2], False),) if args.swiglu else ())
    for name, N, K, f32 in gemms:
        wbytes = N * K * 2
        copies = max(2, -(-3 * l2 // wbytes))
        ws = [torch.randn(N, K, device=dev).to(torch.bfloat16) for _ in range(copies)]
        for M in args.ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)

            act = name.endswith("+act")

            def mm(i, x=x, ws=ws, f32=f32, act=act):
                w = ws[i % len(ws)]
                if act:
                    return ops.silu_mul(torch.matmul(x, w.t()))
                return torch.mm(x, w.t(), out_dtype=torch.float32) if f32 else torch.matmul(x, w.t())

            def wxt(i, x=x, ws=ws, f32=f32):
                y = torch.matmul(ws[i % len(ws)], x.t())
                return y.float() if f32 else y

            def skinny(i, x=x, ws=ws, f32=f32, act=act):
                if act:
                    return ops.skinny_swiglu(x, ws[i % len(ws)])
                return ops.skinny_gemm(x, ws[i % len(ws)], out_dtype=torch.float32 if f32 else torch.bfloat16)

            ref = mm(0)
            variants = {"matmul": mm} if args.no_lt or act else {"matmul": mm, "lt": mm, "w@xT": wxt}
            if M <= ops.SKINNY_MAX_M:
                variants["skinny"] = skinny
            width = ops.skinny_staged_rows(M)
            built = [c + (1,) for c in ops.SKINNY_STAGED_CONFIGS] if width == 8 else ops.SKINNY_STAGED_WIDE.get(width, ())
            for kc, S, pl, C, tp in staged if M <= ops.SKINNY_STAGED_MAX_M else ():
                if (kc, S, pl, tp) not in built:
                    continue

                def st(i, x=x, ws=ws, f32=f32, act=act, kc=kc, S=S, pl=pl, C=C, tp=tp):
                    return ops.skinny_staged(x, ws[i % len(ws)], out_dtype=torch.float32 if f32 else torch.bfloat16,
                                             swiglu=act, kc=kc, stages=S, lanes=pl, ctas_per_sm=C, tp=tp)
                variants[f"k{kc}s{S}p{pl}x{C}" + (f"t{tp}" if tp > 1 else "")] = st
            for kc, S, tp, C in ops.SKINNY_CLUSTER_CONFIGS if args.cluster and 16 < M <= ops.SKINNY_CLUSTER_MAX_M else ():
                def cl(i, x=x, ws=ws, f32=f32, act=act, kc=kc, S=S, tp=tp, C=C):
                    return ops.skinny_cluster(x, ws[i % len(ws)], out_dtype=torch.float32 if f32 else torch.bfloat16,
                                              swiglu=act, kc=kc, stages=S, tp=tp, cluster=C)
                variants[f"cl-k{kc}s{S}t{tp}c{C}"] = cl
            line = f"{name:>11} M={M:<3}"
            for v, fn in variants.items():
                torch.backends.cuda.preferred_blas_library("cublaslt" if v == "lt" else lib0)
                try:
                    out = fn(0)
                    out = out.t() if v == "w@xT" else out
                    diff = (out.float() - ref.float()).abs().max().item()
                    us = timed(fn, args.reps)
                finally:
                    torch.backends.cuda.preferred_blas_library(lib0)
                line += f"  {v} {us:7.1f} ({wbytes / us / 1e3:5.0f}, d={diff:.2g})"
                rows.append(dict(gemm=name, M=M, variant=v, us=us, GBps=wbytes / us / 1e3, max_diff=diff))
            print(line, flush=True)
        del ws
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_blas.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
