#!/usr/bin/env python
"""How much faster is a decode attention whose K/V already sit in L2? The ceiling of fetching the next layer's K/V
into L2 during the GEMMs before its attention (fifty-fifth session; docs/performance/decode_step.md, "The next
layer's K/V in L2").

    python benches/gpu/probe_kv_l2.py [--batches 32 64] [--lens 128 288 512] [--reps 30]

qwen3-0.6b's decode attention (16 query heads, 8 K/V heads, D 128, pages of 16 in shuffled order; the caches hold
only the sequences' pages), every sequence ``L`` keys, the engine's ``auto`` split. Its kernel time (torch.profiler:
CUPTI's start and end of each launch) after:

* ``cold``: a 256 MB read (the K/V out of L2);
* ``warm``: that read, then a read of every cached page (the K/V in L2 at normal priority);
* ``warm+gemm``: ``warm``, then one qwen3-0.6b layer's four GEMMs on the warpgroup kernel (30 MB of weights streamed at
  L2 evict-first priority, as the engine's decode GEMMs stream them), then the attention: what stays in L2 of K/V
  read ahead of a layer's GEMMs;
* ``warm+2gemm``: the same with two layers' GEMMs between;
* ``cold+gemm``: the 256 MB read, one layer's GEMMs, the attention (the GEMMs' own time without a prefetch);
* ``pf+gemm``: the 256 MB read, then ``ops.kv_prefetch`` on one CTA a sequence (one bulk L2 prefetch a page) right
  before one layer's GEMMs, then the attention: the prefetch beside the GEMMs, and what it costs them. (The fifty-fifth
  session's log came from the probe's own copy of that kernel, ``kv_prefetch_probe.cu``, removed once the engine had
  it: the same prefetches, by 128 threads a CTA, without the PDL trigger and wait.) Each kernel is timed alone, so
  this does not show that a CTA with bulk prefetches in flight ends only when they land: in the engine's chain the
  next kernel waits for them (docs/performance/decode_step.md, "The next layer's K/V in L2, in the engine").

A one-element fill comes right before each attention, so its programmatic launch never overlaps the kernel before
(its time is its own). The outputs of all modes are compared bitwise first (the cache's place cannot change a bit).
Prints a table: the attention's mean, min and max µs per mode and the GB/s of the K/V bytes at its mean; then the
GEMMs' summed µs a layer per mode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches" / "gpu"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from check_kernels import build_paged  # noqa: E402
from optimized import ops  # noqa: E402
from reference.attention import split_size_for  # noqa: E402

N_Q, N_KV, D, BS = 16, 8, 128, 16
#: one qwen3-0.6b layer's GEMMs: (N, K, swiglu) of qkv, o_proj, gate/up, down
LAYER = ((4096, 1024, False), (1024, 2048, False), (6144, 1024, True), (1024, 3072, False))
MODES = ("cold", "warm", "warm+gemm", "warm+2gemm", "cold+gemm", "pf+gemm")
#: the GEMM layers before the attention, by mode
GEMM_LAYERS = {"warm+gemm": 1, "warm+2gemm": 2, "cold+gemm": 1, "pf+gemm": 1}


def _kernel_us(prof, needle: str) -> list[float]:
    """Device µs of every launch whose kernel name holds ``needle``."""
    return [e.time_range.elapsed_us() for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and needle in e.name]


def run(mode: str, prob: tuple, layer: list, flush: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """One attention after ``mode``'s prelude (``MODES``); ``prob`` = (q, k, v, tables, lens, split, max splits)."""
    q, k, v, bt, lens, split, max_splits = prob
    flush.sum()
    if mode.startswith("warm"):
        k.sum()
        v.sum()
    if mode.startswith("pf"):
        ops.kv_prefetch(k, v, bt, lens, 1 << 62, ctas=1)
    for _ in range(GEMM_LAYERS.get(mode, 0)):
        for _, x, w, sw, kp in layer:
            ops.skinny_wg(x, w, swiglu=sw, kp=kp)
    one.fill_(0.0)                                  # the attention's launch cannot overlap the kernel before
    return ops.split_kv_decode(q, k, v, bt, lens, split, max_splits=max_splits)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", nargs="*", type=int, default=[32, 64])
    ap.add_argument("--lens", nargs="*", type=int, default=[128, 288, 512])
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    print(torch.cuda.get_device_name(dev), "L2", torch.cuda.get_device_properties(dev).L2_cache_size >> 20, "MB")
    flush = torch.empty(64 << 20, dtype=torch.float32, device=dev)          # 256 MB
    one = torch.empty(1, device=dev)
    gemms = []
    for M in sorted(set(a.batches)):
        for N, K, sw in LAYER:
            x = (torch.randn(M, K, generator=gen) * 0.1).to(torch.bfloat16).to(dev)
            w = (torch.randn(N, K, generator=gen) * 0.02).to(torch.bfloat16).to(dev)
            gemms.append((M, x, w, sw, ops.skinny_wg_split(N, K, sw)))
    print(f"{'batch':>5} {'L':>5} {'K/V MB':>7} " + " ".join(f"{m:>22}" for m in MODES))
    for B in a.batches:
        layer = [g for g in gemms if g[0] == B]
        for L in a.lens:
            k, v, bt, lens = build_paged([L] * B, BS, N_KV, D, gen, dev, extra_pages=0)
            q = (torch.randn(B, N_Q, D, generator=gen)).to(torch.bfloat16).to(dev)
            split = split_size_for("auto", 0, [L] * B, N_KV)
            max_splits = -(-L // split) if split else 1
            kv_bytes = 2 * B * L * N_KV * D * 2

            prob = (q, k, v, bt, lens, split, max_splits)
            outs = [run(m, prob, layer, flush, one) for m in MODES]
            torch.cuda.synchronize()
            for m, o in zip(MODES[1:], outs[1:]):
                if not torch.equal(o, outs[0]):
                    print(f"FAIL: {m} output differs from cold at batch {B}, L {L}")
                    return 1
            cells, gemm_us = [], []
            for m in MODES:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(a.reps):
                        run(m, prob, layer, flush, one)
                    torch.cuda.synchronize()
                us = _kernel_us(prof, "partials")
                mean = sum(us) / len(us)
                cells.append(f"{mean:6.2f} ({min(us):5.2f}-{max(us):5.2f}) {kv_bytes / mean / 1e3:5.0f}")
                layers = a.reps * GEMM_LAYERS.get(m, 0)
                if layers:
                    gemm_us.append(f"{m} {sum(_kernel_us(prof, 'skinny_wg')) / layers:.2f}")
            print(f"{B:>5} {L:>5} {kv_bytes / 1e6:7.1f} " + " ".join(f"{c:>22}" for c in cells), flush=True)
            print(f"      GEMMs µs a layer: {', '.join(gemm_us)}", flush=True)
    print("cells: the attention's mean µs (min-max) over the launches, then GB/s of the K/V bytes at the mean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
