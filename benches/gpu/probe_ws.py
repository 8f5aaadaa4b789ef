#!/usr/bin/env python
"""The warp-specialised wgmma prefill (``ws``) beside the engine's kernel, ``wg128`` and SDPA flash, in one process.

    python benches/gpu/probe_ws.py [--problems N,C,P ...] [--variants x2 wg128 ws ws:0] [--reps 20] [--rounds 3]

(``ws``: the engine's grid for the ws kernel; ``ws:K``: ws with ``ops.WS_CTAS_PER_SM = K`` at every chunk length,
K CTAs a multiprocessor looping over the work items, 0: one CTA per work item.)

For each problem (N sequences, a chunk of C new tokens each over a cached prefix of P; qwen3-8b heads, pages of
16 in shuffled order, the prefill lab's problems by default) every variant's output is checked before timing:
bitwise equal to the first variant's (the kernels of one tile size give a row the same bits, ``PrefillCfg`` in
attention.cu), and within 1e-2 of SDPA flash on a dense copy of the same keys (bf16 outputs of the same math).
Times: CUDA graphs of ``--reps`` calls (``check_kernels._time``), best of ``--rounds``, the kernels alternated
within each round; TFLOP/s of the causal FLOPs and each variant's time against flash's.
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
#: the prefill lab's twelve problems (benches/test_kernel_prefill.py): (sequences, chunk, cached prefix)
LAB = [(32, 256, 0), (32, 256, 1024), (32, 256, 4096), (32, 256, 16384), (8, 1024, 0), (8, 1024, 1024),
       (8, 1024, 4096), (8, 1024, 16384), (2, 4096, 0), (2, 4096, 1024), (2, 4096, 4096), (2, 4096, 16384)]


def _run(v: str, q, p, idx, pos):
    """One prefill by variant ``v``; ``ws:K`` is ``ws`` with ``ops.WS_CTAS_PER_SM = K`` (0: a CTA per work item)."""
    name, _, ctas = v.partition(":")
    keep = ops.WS_CTAS_PER_SM, ops.WS_PERSISTENT_MAX_CHUNK
    if ctas:   # K CTAs a multiprocessor at any chunk length
        ops.WS_CTAS_PER_SM, ops.WS_PERSISTENT_MAX_CHUNK = int(ctas), 1 << 30
    try:
        return ops.paged_prefill(q, p.k_cache, p.v_cache, p.tables, p.lens, idx, pos, variant=name)
    finally:
        ops.WS_CTAS_PER_SM, ops.WS_PERSISTENT_MAX_CHUNK = keep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", default=None, metavar="N,C,P")
    ap.add_argument("--variants", nargs="*", default=["x2", "wg128", "ws"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    problems = [tuple(int(x) for x in s.split(",")) for s in a.problems] if a.problems else LAB
    dev = torch.device("cuda")
    have = ops.prefill_variants(D, 0)
    missing = [v for v in a.variants if v.partition(":")[0] not in have]
    if missing:
        print(f"variants {missing} not on this device's build (it has {have})")
        return 2
    gen = torch.Generator(device=dev).manual_seed(0)
    sm = D ** -0.5
    print(f"device {torch.cuda.get_device_name()}; qwen3-8b heads ({N_Q} q, {N_KV} kv, D {D}); variants {a.variants}")
    head = " ".join(f"{v + ' TF':>9}" for v in a.variants) + " " + " ".join(f"{v + '/fl':>9}" for v in a.variants)
    print(f"{'problem':>16} {'flash TF':>9} {head}")
    failed = 0
    for nseq, C, P in problems:
        L = P + C
        p = paged_problem(nseq, L, N_KV, D, BS, torch.bfloat16, dev, gen)
        q = torch.randn(nseq * C, N_Q, D, device=dev, generator=gen).to(torch.bfloat16)   # [T, n_q, D]
        pos = torch.arange(P, L, device=dev, dtype=torch.int32).repeat(nseq)             # [T]
        idx = torch.arange(nseq, device=dev, dtype=torch.int32).repeat_interleave(C)     # [T]
        kd, vd = (x.transpose(1, 2).contiguous() for x in p.dense())                     # [nseq, n_kv, L, D]
        qd = q.view(nseq, C, N_Q, D).transpose(1, 2).contiguous()                         # [nseq, n_q, C, D]
        calls = {v: (lambda v=v, q=q, p=p, idx=idx, pos=pos: _run(v, q, p, idx, pos)) for v in a.variants}
        flash = sdpa_call("flash", qd, kd, vd, sm, "lower_right", "enable_gqa")
        ref = flash().transpose(1, 2).reshape(nseq * C, N_Q, D).float()
        outs = {v: fn() for v, fn in calls.items()}
        torch.cuda.synchronize()
        notes = []
        first = a.variants[0]
        for v, out in outs.items():
            diff = (out.float() - ref).abs().max().item()
            if not diff <= 1e-2:
                notes.append(f"{v} vs flash max diff {diff:.1e} FAIL")
            if v != first and not torch.equal(out, outs[first]):
                d = (out.float() - outs[first].float()).abs().max().item()
                notes.append(f"{v} not bitwise equal to {first} (max diff {d:.1e}) FAIL")
        failed += len(notes)
        times: dict[str, list[float]] = {v: [] for v in [*a.variants, "flash"]}
        for _ in range(a.rounds):
            for v, fn in calls.items():
                times[v].append(gpu_seconds(fn, a.reps) * 1e3)
            times["flash"].append(gpu_seconds(flash, a.reps) * 1e3)
        best = {v: min(t) for v, t in times.items()}
        flops = 4.0 * D * N_Q * nseq * (C * P + C * (C + 1) / 2)
        tf = {v: flops / t / 1e9 for v, t in best.items()}
        cols = " ".join(f"{tf[v]:>9.1f}" for v in a.variants) + " " + \
            " ".join(f"{best['flash'] / best[v]:>9.3f}" for v in a.variants)
        print(f"{f'{nseq}x{C} over {P}':>16} {tf['flash']:>9.1f} {cols}" + ("  " + "; ".join(notes) if notes else ""),
              flush=True)
        del p, q, kd, vd, qd, outs, ref
    print("all checks passed" if not failed else f"{failed} checks FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
