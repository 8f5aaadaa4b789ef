#!/usr/bin/env python
"""Is the paged prefill's gap to flash at 256-token chunks a matter of waves? One process, both kernels.

    python benches/gpu/probe_waves.py [--chunk 256] [--prefixes 1024 4096] [--nseq 16 24 32 33 40 48 64 66] [--reps 20]

The lab's 256-token problems (``benches/test_kernel_prefill.py``: 32 sequences, qwen3-8b heads) give the
two-tiles-per-warp kernel 32 x 8 KV heads x 8 row tiles = 2048 CTAs of nearly equal work. At two CTAs a
multiprocessor (132 SMs) that is 7.76 waves, so about a quarter of the last wave's slots idle. This probe
times our kernel (the engine's choice, ``ops.prefill_variant``) and SDPA's flash backend on the same problem,
a dense copy of the same keys, for several sequence counts. If waves are the cause, ours / flash rises where
the CTA count fills whole waves (33 sequences: 2112 CTAs = 8 x 264) and falls again between them.

Each problem: ours checked against flash on the same keys before timing (max abs difference printed, a
failure above 1e-2: bf16 outputs of the same math, where the layouts only move the keys). Times: CUDA graphs
of ``--reps`` calls (``check_kernels._time``), best of ``--rounds``, the two kernels alternated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import torch  # noqa: E402

from _attn import paged_problem, sdpa_call  # noqa: E402
from check_kernels import _time as gpu_seconds  # noqa: E402
from optimized import ops  # noqa: E402

N_Q, N_KV, D, BS = 32, 8, 128, 16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--prefixes", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--nseq", type=int, nargs="*", default=[16, 24, 32, 33, 40, 48, 64, 66])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    gen = torch.Generator(device=dev).manual_seed(0)
    C, sm = a.chunk, D ** -0.5
    print(f"device {torch.cuda.get_device_name()}, {sms} SMs; chunk {C}, qwen3-8b heads ({N_Q} q, {N_KV} kv, D {D})")
    print(f"{'prefix':>6} {'nseq':>4} {'kernel':>7} {'CTAs':>5} {'waves@2':>7} {'ours ms':>8} {'flash ms':>8} "
          f"{'ours TF':>7} {'flash TF':>8} {'ours/flash':>10} {'max diff':>8}")
    failed = 0
    for P in a.prefixes:
        for nseq in a.nseq:
            L = P + C
            p = paged_problem(nseq, L, N_KV, D, BS, torch.bfloat16, dev, gen)
            q = torch.randn(nseq * C, N_Q, D, device=dev, generator=gen).to(torch.bfloat16)   # [T, n_q, D]
            pos = torch.arange(P, L, device=dev, dtype=torch.int32).repeat(nseq)             # [T]
            idx = torch.arange(nseq, device=dev, dtype=torch.int32).repeat_interleave(C)     # [T]
            variant = ops.prefill_variant(nseq * C, N_Q, N_KV, D, sms)
            kd, vd = (x.transpose(1, 2).contiguous() for x in p.dense())                     # [nseq, n_kv, L, D]
            qd = q.view(nseq, C, N_Q, D).transpose(1, 2).contiguous()                         # [nseq, n_q, C, D]
            ours = lambda q=q, p=p, idx=idx, pos=pos: ops.paged_prefill(q, p.k_cache, p.v_cache, p.tables, p.lens, idx, pos)
            flash = sdpa_call("flash", qd, kd, vd, sm, "lower_right", "enable_gqa")
            diff = (ours().float() - flash().transpose(1, 2).reshape(nseq * C, N_Q, D).float()).abs().max().item()
            ok = diff <= 1e-2
            failed += not ok
            t_ours, t_flash = [], []
            for _ in range(a.rounds):
                t_ours.append(gpu_seconds(ours, a.reps) * 1e3)
                t_flash.append(gpu_seconds(flash, a.reps) * 1e3)
            mo, mf = min(t_ours), min(t_flash)
            flops = 4.0 * D * N_Q * nseq * (C * P + C * (C + 1) / 2)
            rows = 128 if variant == "x2" else 64
            ctas = nseq * N_KV * -(-C * (N_Q // N_KV) // rows)
            print(f"{P:>6} {nseq:>4} {variant:>7} {ctas:>5} {ctas / (2 * sms):>7.2f} {mo:>8.4f} {mf:>8.4f} "
                  f"{flops / mo / 1e9:>7.1f} {flops / mf / 1e9:>8.1f} {mf / mo:>10.3f} {diff:>8.1e}"
                  f"{'' if ok else '  FAIL (> 1e-2)'}", flush=True)
            del p, q, kd, vd, qd
    print("all checks passed" if not failed else f"{failed} checks FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
