#!/usr/bin/env python
"""Launch the attention kernels on a few lab problems, for a profiler (Nsight Compute) to read.

    python benches/gpu/probe_kernels.py [--only prefill decode sweep host epilogue warps] [--reps N]
    ncu --clock-control none -k regex:"paged_prefill|split_kv" --launch-skip 2 --launch-count 4 \\
        --section SpeedOfLight --section WarpStateStats python benches/gpu/probe_kernels.py

Problems (qwen3-8b attention: 32 query heads, 8 KV heads, head_dim 128, pages of 16 in shuffled
order, as in the kernel labs): paged prefill of (sequences x chunk over cached prefix) 8 x 1024 over
4096, 32 x 256 over 0, 2 x 4096 over 0, 32 x 256 over 16384 (each ``ops.PREFILL_VARIANTS`` entry),
and split-KV decode at (batch, context, split) =
(1, 4096, 256), (32, 4096, 256), (128, 16384, one split). Each launch runs ``--reps`` times in a CUDA
graph after a warm-up; the CUDA-event times are printed so that the script is also a quick A/B without a
profiler.
``sweep``: split-KV decode at batch 1 and 8 over split sizes, one and two launches, PDL off and on.
``splits``: split-KV decode at batch 1-128 and context 1k-16k over split counts, from DRAM (rotated
copies), with ``splits.json`` under ``--out``: the data of the ``auto`` split rule.
``host``: the host time to enqueue one eager op while the GPU is kept busy, and a cProfile of it.
``warps``: the skinny GEMMs of a qwen3-8b step with 4, 8 and 16 warps per CTA.
``epilogue``: the skinny GEMMs of a qwen3-8b layer at batch 1 and 8, alone and with their layer's next
launch (add_rmsnorm; silu_mul), and the gate/up GEMM with its SwiGLU epilogue (``skinny_swiglu``).
Nothing is asserted here: correctness is ``check_kernels.py``'s job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import torch  # noqa: E402

from _attn import paged_problem  # noqa: E402
from check_kernels import _time as gpu_seconds  # noqa: E402  (a sibling script: benches/gpu is on sys.path)
from optimized import ops  # noqa: E402

N_Q, N_KV, D, BS = 32, 8, 128, 16


def _time(fn, reps: int) -> float:
    """Milliseconds per call, GPU time only (check_kernels' timer: ``reps`` calls in one CUDA graph after a
    warm-up, so the host's enqueue cost -- ~0.2 ms for an eager split-KV decode -- stays out)."""
    return gpu_seconds(fn, iters=reps) * 1e3


#: (sequences, chunk, cached prefix) of the ``prefill`` section (``--prefill-problems``: ``N,C,P`` triples)
PREFILL_PROBLEMS: list[tuple[int, int, int]] = [(8, 1024, 4096), (32, 256, 0), (2, 4096, 0), (32, 256, 16384)]


def prefill(reps: int, gen: torch.Generator) -> None:
    for nseq, C, P in PREFILL_PROBLEMS:
        p = paged_problem(nseq, P + C, N_KV, D, BS, torch.bfloat16, "cuda", gen)
        q = torch.randn(nseq * C, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)
        pos = torch.arange(P, P + C, device="cuda", dtype=torch.int32).repeat(nseq)
        idx = torch.arange(nseq, device="cuda", dtype=torch.int32).repeat_interleave(C)
        flops = 4.0 * D * N_Q * nseq * (C * P + C * (C + 1) / 2)
        for v in ops.prefill_variants(D, 0):
            ms = _time(lambda v=v, p=p, q=q, idx=idx, pos=pos: ops.paged_prefill(
                q, p.k_cache, p.v_cache, p.tables, p.lens, idx, pos, variant=v), reps)
            print(f"paged_prefill[{v}] {nseq}x{C} over {P}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s", flush=True)
        del p


#: (batch, context, split size) of the ``decode`` section (``--decode-problems``: ``B,ctx,split`` triples)
DECODE_PROBLEMS: list[tuple[int, int, int]] = [(1, 4096, 256), (32, 4096, 256), (128, 16384, 16384)]


def decode(reps: int, gen: torch.Generator) -> None:
    for B, ctx, split in DECODE_PROBLEMS:
        p = paged_problem(B, ctx, N_KV, D, BS, torch.bfloat16, "cuda", gen)
        q = torch.randn(B, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)
        nbytes = 2 * B * ctx * N_KV * D * 2
        ms = _time(lambda p=p, q=q, split=split, ctx=ctx: ops.split_kv_decode(
            q, p.k_cache, p.v_cache, p.tables, p.lens, split, max_splits=-(-ctx // split)), reps)
        print(f"split_kv_decode B={B} ctx={ctx} split={split}: {ms * 1e3:.1f} us, {nbytes / ms / 1e6:.0f} GB/s of K/V",
              flush=True)
        del p


def sweep(reps: int, gen: torch.Generator) -> None:
    """Split-KV decode at small batches, where a step's attention is latency, not bandwidth: one call's
    GPU time per (batch, context, split size), one launch (fused) and two, with and without programmatic
    dependent launch (back-to-back calls in the timing graph overlap each other's prologue when it is on)."""
    from optimized import launch

    for B in (1, 8):
        for ctx in (300, 1024, 4096):
            p = paged_problem(B, ctx, N_KV, D, BS, torch.bfloat16, "cuda", gen)
            q = torch.randn(B, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)
            cells = []
            for split in (32, 64, 128, 256, 512, None):
                size = split or ctx
                for fused in (True, False):
                    for pdl in (False, True):
                        launch.set_pdl(pdl)
                        us = _time(lambda p=p, q=q, split=split, n=-(-ctx // size), fused=fused: ops.split_kv_decode(
                            q, p.k_cache, p.v_cache, p.tables, p.lens, split, max_splits=n,
                            fused=fused), reps) * 1e3
                        cells.append(f"{split or 'one'}/{'f' if fused else '2'}/{'pdl' if pdl else 'plain'} {us:.1f}")
            launch.set_pdl(None)
            print(f"decode sweep B={B} ctx={ctx} (split/launches/launch kind us): " + ", ".join(cells), flush=True)
            del p


#: where ``splits`` writes its JSON (``--out``)
OUT: Path | None = None


def splits(reps: int, gen: torch.Generator) -> None:
    """The data behind ``split_kv="auto"``: one launch of the engine's split-KV decode (``fused`` as the
    engine picks it) per (batch, context, split count), GPU time per call. Each graph cycles over copies
    of the problem that together exceed the 50 MB L2, so a small problem is read from DRAM as in a decode
    step. Writes ``splits.json`` under ``--out``."""
    import json

    rows = []
    for B in (1, 2, 4, 8, 16, 32, 64, 128):
        for ctx in (1024, 2048, 4096, 8192, 16384):
            kv = 2 * B * ctx * N_KV * D * 2
            nsets = max(1, min(48, -(-(192 << 20) // kv)))
            probs = [paged_problem(B, ctx, N_KV, D, BS, torch.bfloat16, "cuda", gen) for _ in range(nsets)]
            qs = [torch.randn(B, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(nsets)]
            per_split = [-(-ctx // n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32)]
            sizes = sorted({-(-k // 64) * 64 for k in per_split}, reverse=True)  # whole 64-key tiles
            cells = []
            for size in sizes:
                n = -(-ctx // size)
                turn = [0]

                def call(size=size, n=n, turn=turn, probs=probs, qs=qs):
                    i = turn[0] % len(probs)
                    turn[0] += 1
                    p = probs[i]
                    ops.split_kv_decode(qs[i], p.k_cache, p.v_cache, p.tables, p.lens, size, max_splits=n)

                us = _time(call, max(reps, nsets)) * 1e3
                rows.append({"batch": B, "context": ctx, "splits": n, "split_size": size, "us": us, "gbps": kv / us / 1e3})
                cells.append(f"{n}x{size} {us:.1f}")
            best = min((r for r in rows if r["batch"] == B and r["context"] == ctx), key=lambda r: r["us"])
            print(f"splits B={B} ctx={ctx} ({nsets} sets; splits x size us): " + ", ".join(cells)
                  + f"  | best {best['splits']}x{best['split_size']} {best['us']:.1f} us "
                  f"{best['gbps']:.0f} GB/s", flush=True)
            del probs, qs
            torch.cuda.empty_cache()
    if OUT is not None:
        (OUT / "splits.json").write_text(json.dumps(rows, indent=1))


def host(reps: int, gen: torch.Generator) -> None:
    """Host time to enqueue one eager op (Python checks + CuPy launch), and where it goes (cProfile)."""
    import cProfile
    import pstats
    import time

    p = paged_problem(1, 4096, N_KV, D, BS, torch.bfloat16, "cuda", gen)
    q = torch.randn(1, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)
    x = torch.randn(8, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    calls = {"split_kv_decode B=1 ctx=4096": lambda: ops.split_kv_decode(q, p.k_cache, p.v_cache, p.tables, p.lens,
                                                                          256, max_splits=16),
             "rmsnorm 8x4096": lambda: ops.rmsnorm(x, w, 1e-6),
             "torch.add 8x4096 (for scale)": lambda: torch.add(x, x)}
    from optimized import launch
    for pdl in (False, True):              # CuPy's launch path, then the driver's (cuLaunchKernelEx with PDL)
        launch.set_pdl(pdl)
        for name, fn in calls.items():
            fn()
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)          # keep the GPU busy: the loop measures the host only
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            us = (time.perf_counter() - t0) / reps * 1e6
            torch.cuda.synchronize()
            path = "driver + PDL" if pdl else "CuPy"
            print(f"host enqueue {name} ({'torch' if name.startswith('torch') else path}): {us:.1f} us per call", flush=True)
    launch.set_pdl(None)
    torch.cuda._sleep(50_000_000)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        calls["split_kv_decode B=1 ctx=4096"]()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


#: weight tensors a GEMM probe cycles through, so that no call finds its weights in L2 (50 MB)
COPIES = 3


def _weights(N: int, K: int, gen: torch.Generator) -> list[torch.Tensor]:
    """``COPIES`` bf16 weights ``[N, K]`` with unit-variance products."""
    return [(torch.randn(N, K, device="cuda", generator=gen) * K ** -0.5).to(torch.bfloat16) for _ in range(COPIES)]


def _per_gemm(tag: str, N: int, K: int, call, ws: list[torch.Tensor], reps: int) -> None:
    """Print us and GB/s of weights per ``call(w)``, timed over the ``ws`` in turn."""
    us = _time(lambda: [call(w) for w in ws], reps) * 1e3 / len(ws)
    print(f"{tag}: {us:.1f} us, {2 * N * K / us / 1e3:.0f} GB/s", flush=True)


def epilogue(reps: int, gen: torch.Generator) -> None:
    """Per GEMM of a qwen3-8b layer: (a) the skinny GEMM alone, (b) it and its layer's next launch
    (add_rmsnorm or silu_mul), (c) for gate/up, the fused kernel (``skinny_swiglu``)."""
    H, I, eps = 4096, 12288, 1e-6
    for M in (1, 8):
        xh = torch.randn(M, H, device="cuda", generator=gen).to(torch.bfloat16)
        xi = torch.randn(M, I, device="cuda", generator=gen).to(torch.bfloat16)
        r = (torch.randn(M, H, device="cuda", generator=gen) * 3).to(torch.bfloat16)
        nw = torch.ones(H, device="cuda", dtype=torch.bfloat16)
        for name, N, K, x in (("o_proj", H, H, xh), ("down_proj", H, I, xi), ("gate_up", 2 * I, H, xh)):
            calls = [("GEMM alone", lambda w, x=x: ops.skinny_gemm(x, w))]
            if name == "gate_up":
                calls += [("GEMM + next launch", lambda w, x=x: ops.silu_mul(ops.skinny_gemm(x, w))),
                          ("fused", lambda w, x=x: ops.skinny_swiglu(x, w))]
            else:
                calls += [("GEMM + next launch", lambda w, x=x, r=r, nw=nw: ops.add_rmsnorm(ops.skinny_gemm(x, w), r, nw, eps))]
            ws = _weights(N, K, gen)
            for label, call in calls:
                _per_gemm(f"epilogue {name} M={M} N={N} K={K} {label}", N, K, call, ws, reps)


def warps(reps: int, gen: torch.Generator) -> None:
    """The skinny GEMMs of a qwen3-8b decode step (and the LM head) at batch 1 and 8 with 8, 4 and 16
    warps per CTA (``skinny_warps``' pick marked). down_proj comes first and gate/up second, so that a
    profiler's first ``skinny_m8_w8_bf16`` / ``skinny_swiglu_m8_w8`` launches are theirs."""
    shapes = (("down_proj", 4096, 12288), ("gate_up+swiglu", 24576, 4096), ("qkv", 6144, 4096),
              ("o_proj", 4096, 4096), ("lm_head", 151936, 4096))
    for M in (1, 8):
        for name, N, K in shapes:
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            ws = _weights(N, K, gen)
            dt = torch.float32 if name == "lm_head" else torch.bfloat16
            for wp in (8, 4, 16):
                if name.startswith("gate_up"):
                    call = lambda w, x=x, wp=wp: ops.skinny_swiglu(x, w, warps=wp)                  # noqa: E731
                else:
                    call = lambda w, x=x, wp=wp, dt=dt: ops.skinny_gemm(x, w, out_dtype=dt, warps=wp)  # noqa: E731
                pick = " (skinny_warps' pick)" if wp == ops.skinny_warps(N, K) else ""
                _per_gemm(f"warps {name} M={M} N={N} K={K} warps {wp}{pick}", N, K, call, ws, reps)
            del ws


#: --only sections, run in this order
SECTIONS = {"prefill": prefill, "decode": decode, "sweep": sweep, "splits": splits, "host": host, "epilogue": epilogue,
            "warps": warps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=tuple(SECTIONS), default=("prefill", "decode"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="folder for the JSON of the splits section")
    ap.add_argument("--decode-problems", nargs="*", default=None, metavar="B,CTX,SPLIT",
                    help="the decode section's problems instead of its default three")
    ap.add_argument("--prefill-problems", nargs="*", default=None, metavar="N,C,P",
                    help="the prefill section's problems instead of its default four")
    a = ap.parse_args()
    global OUT
    OUT = a.out
    if a.decode_problems:
        DECODE_PROBLEMS[:] = [tuple(int(x) for x in t.split(",")) for t in a.decode_problems]
    if a.prefill_problems:
        PREFILL_PROBLEMS[:] = [tuple(int(x) for x in t.split(",")) for t in a.prefill_problems]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, section in SECTIONS.items():
        if name in a.only:
            section(a.reps, gen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
