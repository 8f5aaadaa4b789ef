#!/usr/bin/env python
"""Where a split-KV decode launch spends its time: per-CTA phase stamps of ``split_kv_partials``.

    python benches/gpu/trace_decode.py [--problems 1:4096 8:4096 ...] [--reps 5]

Compiles ``attention.cu`` with ``-DTK_DECODE_TRACE=N`` (its ``TRACE(i)`` stamps compile to nothing
otherwise), makes it the module ``optimized.ops`` launches from, and runs ``split_kv_decode`` the way
the engine does (``auto`` split, fused reduce) on qwen3-8b attention shapes (32 query heads, 8 KV
heads, head dim 128, pages of 16 in shuffled order), in two states: *warm* (the same call just
before it: keys in L2) and *cold* (a 512 MiB write in between: keys from DRAM). Thread 0 of every
CTA stamps the SM clock at

    0 start (after pdl_entry) -> 1 length and first pages in -> 2 first K/V tile landed -> 3 key loop
    done -> 4 warp states merged and written -> 5 ticket known -> 7 end (the last CTA: its fold written)

and the global timer at 0 and 7. Per phase the script prints the median and maximum over CTAs and the
time of the CTA that folded (the last to take its ticket), all in microseconds at the SM clock
(calibrated against the global timer over the run's CTAs), and the launch's span from the first CTA's
start to the last CTA's end. A launch's own cost before its first CTA starts is not in the span.
Each state is repeated ``--reps`` times; the run with the median span is printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "benches" / "gpu"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from _attn import paged_problem  # noqa: E402
from ab_attention import build, install  # noqa: E402
from optimized import kernels, ops  # noqa: E402
from reference.attention import split_size_for  # noqa: E402

N_Q, N_KV, D, BS = 32, 8, 128, 16
MAX_CTAS = 8192
PHASES = [("prologue: length, first pages", 0, 1), ("first K/V tile", 1, 2), ("rest of the key loop", 2, 3),
          ("merge warps, write state", 3, 4), ("take the ticket", 4, 5)]


def traced_module():
    return build(kernels.source("attention"), (f"TK_DECODE_TRACE={MAX_CTAS}",))


def read_trace(mod, n: int) -> np.ndarray:
    import cupy

    ptr = mod.get_global("tk_decode_trace")
    arr = cupy.ndarray((MAX_CTAS, 10), dtype=cupy.uint64, memptr=ptr)
    out = cupy.asnumpy(arr[:n]).astype(np.int64)
    arr.fill(0)
    return out


def report(name: str, t: np.ndarray, ns_per_cycle: float) -> None:
    us = ns_per_cycle / 1e3
    t = t[(t[:, 0] > 0) & (t[:, 9] > 0)]  # the CTAs that ran (every one stamps 0 and its end, 7 and 9)
    start, end = t[:, 8], t[:, 9]
    span = (end.max() - start.min()) / 1e3
    has_ticket = t[:, 5] > 0
    last = None
    if has_ticket.any():  # the CTA that folded: among those that took a ticket, the one that ended last
        cand = np.flatnonzero(has_ticket)
        last = cand[np.argmax(t[cand, 7] - t[cand, 5])]
    print(f"  {name}: span {span:.2f} us over {len(t)} CTAs (first start -> last end); CTA starts spread over "
          f"{(start.max() - start.min()) / 1e3:.2f} us")
    print(f"    {'phase':32s} {'median us':>10s} {'max us':>8s} {'folding CTA':>12s}")
    for label, a, b in PHASES:
        ok = (t[:, a] > 0) & (t[:, b] > 0)
        if not ok.any():
            continue
        d = (t[ok, b] - t[ok, a]) * us
        lc = f"{(t[last, b] - t[last, a]) * us:12.2f}" if last is not None and ok[last] else f"{'-':>12s}"
        print(f"    {label:32s} {np.median(d):10.2f} {d.max():8.2f} {lc}")
    if last is not None:
        print(f"    {'fold (the last CTA)':32s} {'':>10s} {'':>8s} {(t[last, 7] - t[last, 5]) * us:12.2f}")
    whole = (t[:, 7] - t[:, 0]) * us
    lc = f"{whole[last]:12.2f}" if last is not None else f"{'-':>12s}"
    print(f"    {'whole CTA':32s} {np.median(whole):10.2f} {whole.max():8.2f} {lc}")


def trace_problem(mod, B: int, ctx: int, reps: int, sms: int, gen, flush, cal: list[float]) -> None:
    p = paged_problem(B, ctx, N_KV, D, BS, torch.bfloat16, "cuda", gen)
    q = torch.randn(B, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)
    size = split_size_for("auto", 0, [ctx] * B, N_KV, sms)
    n = 1 if size is None else -(-ctx // size)
    ctas = n * N_KV * B
    if ctas > MAX_CTAS:
        print(f"B={B} ctx={ctx}: {ctas} CTAs exceed the trace's {MAX_CTAS}; skipped")
        return

    def call():
        return ops.split_kv_decode(q, p.k_cache, p.v_cache, p.tables, p.lens, size, max_splits=n)

    ref = call().clone()
    torch.cuda.synchronize()
    read_trace(mod, ctas)
    print(f"B={B} ctx={ctx} auto ({n} x {size or ctx}), {ctas} CTAs", flush=True)
    for state in ("warm", "cold"):
        runs = []
        for _ in range(reps):
            if state == "warm":
                call()
            else:
                flush.fill_(1)
            torch.cuda.synchronize()
            read_trace(mod, ctas)
            out = call()
            torch.cuda.synchronize()
            assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), "traced run changed the output"
            t = read_trace(mod, ctas)
            ok = (t[:, 0] > 0) & (t[:, 9] > 0) & (t[:, 8] > 0)
            cyc, ns = t[ok, 7] - t[ok, 0], t[ok, 9] - t[ok, 8]
            good = ns > 2000
            if good.any():
                cal.append(float(np.median(ns[good] / cyc[good])))
            runs.append(((t[ok, 9].max() - t[ok, 8].min()), t))
        runs.sort(key=lambda r: r[0])
        report(state, runs[len(runs) // 2][1], float(np.median(cal)) if cal else 1 / 1.98)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", nargs="*", default=["1:300", "1:4096", "1:16384", "8:300", "8:4096", "32:1024"],
                    help="batch:context pairs")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    kernels.load("attention")
    mod = traced_module()
    install(mod)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    cal: list[float] = []
    for spec in a.problems:
        B, ctx = (int(x) for x in spec.split(":"))
        trace_problem(mod, B, ctx, a.reps, sms, gen, flush, cal)
    if cal:
        print(f"SM clock from the global timer: {1 / np.median(cal):.3f} GHz (median over {len(cal)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
