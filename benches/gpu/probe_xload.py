#!/usr/bin/env python
"""What do a warpgroup GEMM's x copies cost after its PDL wait, and would L2 serving x once a cluster cost less?
(sixty-first session; docs/performance/decode_step.md, "The edge probe, the x copies and the MMA chain after the
wait").

    python benches/gpu/probe_xload.py [--launches 30] [--rounds 3]

``trace_wg.py`` at qwen3-0.6b batch 32 puts 0.74-0.86 µs between a layer GEMM's PDL wait and its first stage landing,
and 1.25-1.73 µs more to its last MMA; the later figure grows with the x bytes a CTA copies (32 rows: 64 KB for qkv
and gate/up, 48 KB for down, 32 KB for o_proj), while its weights are mostly in shared memory before the wait. This
probe isolates those copies (``xload_probe.cu``): every CTA of a grid (one a multiprocessor) copies 32 rows of x,
``K`` columns in 128-column stages, all at once after a meeting of the grid, in four ways: ``same`` (the engine's:
every CTA the same x, stage 0 first), ``rotate`` (the same x, each CTA starting at another stage), ``own`` (each CTA
its own x: no line read twice) and ``mcastC`` (clusters of C CTAs, each rank copying a C-th of the rows into every
CTA of the cluster: L2 serves x once a cluster). Per (K, CTAs, mode) it prints, in µs, medians over ``--launches``
launches of each round and then over the rounds:

* ``first``: the median CTA's meeting to its first stage landed (its SM's cycles, at the SM clock the probe
  measures first);
* ``last``: the median CTA's meeting to its last stage landed (the same); ``slowest``: the grid's first meeting to
  its last landing (%globaltimer, whose step the probe prints: on the sixty-first session's H100 its figures came
  in steps of about 0.25 µs or more, so a CTA's own intervals are timed in cycles);
* ``GB/s a CTA``: the x bytes a CTA over ``last``; ``L2 GB/s``: the bytes L2 served (every CTA's, or a cluster's
  once) over ``slowest``.

Every CTA's sum of the landed values must equal the sum of the x it copied (a row fails with FAIL instead); a grid
whose clusters cannot all be resident at once is reported as ``n/a`` (its meeting would wait for ever: it times
out in the kernel). Modes alternate within each round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from optimized import kernels, launch  # noqa: E402

ROWS, KC, SMEM = 32, 128, 200 * 1024
KS = (1024, 768, 512)                 # qkv and gate/up (K = 1024); down's and o_proj's shares (3072 / 4, 2048 / 4)
GRIDS = (1, 64, 96, 128)
MODES = ("same", "rotate", "own", "mcast2", "mcast4")


def xload_stats(marks: np.ndarray, cycles_per_us: float) -> tuple[float, float, float] | None:
    """(first, last, slowest) µs of one launch's marks (``[CTAs, 6]``: each CTA's %globaltimer ns at its meeting,
    first stage landed and last stage landed, then its SM's clock64 cycles at the same three points): the median
    CTA's meeting to first and to last landed, in cycles over ``cycles_per_us``, and the grid's first meeting to its
    last landing by %globaltimer; None where a CTA's meeting timed out (its %globaltimer mark is 0: the grid was not
    all resident)."""
    if (marks[:, 0] == 0).any():
        return None
    g = marks[:, :3].astype(np.float64) / 1000.0                         # [CTAs, 3] µs
    c = marks[:, 3:].astype(np.float64) / cycles_per_us                  # [CTAs, 3] µs
    first, last = c[:, 1] - c[:, 0], c[:, 2] - c[:, 0]
    return float(np.median(first)), float(np.median(last)), float(g[:, 2].max() - g[:, 0].min())


def clock_stats(out: np.ndarray) -> tuple[float, float, int]:
    """(SM cycles a µs, %globaltimer's smallest step in µs, distinct values it showed) from ``xload_clock``'s
    [ns of the spin, its cycles, smallest step ns, distinct values]."""
    ns, cycles, step, seen = (int(v) for v in out)
    return cycles / (ns / 1000.0), step / 1000.0, seen


def build():
    """``xload_probe.cu`` compiled as the engine's plain kernels are (CuPy's NVRTC, ``kernels.OPTIONS``)."""
    import cupy
    src = kernels.with_headers(Path(__file__).with_name("xload_probe.cu").read_text())
    return cupy.RawModule(code=src, options=kernels.OPTIONS)


def sm_clock(mod=None) -> tuple[float, float, int]:
    """``clock_stats`` of the second of two launches of ``xload_clock`` (of ``mod``, else a fresh build; the first
    lets the clock settle): the SM clock's MHz and %globaltimer's step (also ``probe_mma.py``'s clock)."""
    mod = build() if mod is None else mod
    clock = torch.zeros(4, dtype=torch.int64, device="cuda")
    for _ in range(2):
        launch.launch_pdl(mod.get_function("xload_clock").kernel.ptr, (1,), (32,), (np.uint64(clock.data_ptr()),),
                          0, torch.cuda.current_stream().cuda_stream)
    return clock_stats(clock.cpu().numpy())


class Config:
    """One (K, CTAs, mode): its x, tensor map, kernel and output buffers."""

    def __init__(self, mod, k: int, grid: int, mode: str) -> None:
        self.k, self.grid, self.mode = k, grid, mode
        self.cluster = int(mode[5:]) if mode.startswith("mcast") else 1
        kern = "xload_mcast" if self.cluster > 1 else f"xload_{mode}"
        self.fn = mod.get_function(kern)
        self.fn.max_dynamic_shared_size_bytes = SMEM
        rows_total = ROWS * grid if mode == "own" else ROWS
        gen = torch.Generator(device="cuda").manual_seed(k + grid)
        # small integers: every sum of them is exact in float32, so the check is equality
        self.x = torch.randint(-4, 5, (rows_total, k), device="cuda", generator=gen).to(torch.bfloat16)
        self.map = launch.encode_block_map(self.x.data_ptr(), rows_total, k, 2 * k, KC, ROWS // self.cluster)
        self.start = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.sums = torch.zeros(grid, device="cuda")
        self.marks = torch.zeros(grid, 6, dtype=torch.int64, device="cuda")
        self.resident = (self.cluster == 1 or grid // self.cluster <= launch.max_active_clusters(
            self.fn.kernel.ptr, (128, 1, 1), SMEM, self.cluster))
        per_cta = self.x.float().view(-1, ROWS, k).sum(dim=(1, 2))   # [grid or 1]
        self.want = per_cta if mode == "own" else per_cta.expand(grid)

    def run(self, cycles_per_us: float) -> tuple[float, float, float] | None:
        """One launch: (first, last, slowest) µs, or None where the grid was not all resident."""
        self.start.zero_()
        args = (self.map, np.int32(self.k // KC), np.int32(KC), np.int32(ROWS), np.int32(self.cluster),
                np.uint64(self.start.data_ptr()), np.uint64(self.sums.data_ptr()), np.uint64(self.marks.data_ptr()))
        launch.launch_pdl(self.fn.kernel.ptr, (self.grid,), (128,), args, SMEM,
                          torch.cuda.current_stream().cuda_stream, cluster_x=self.cluster)
        return xload_stats(self.marks.cpu().numpy(), cycles_per_us)

    def wrong(self) -> int:
        """CTAs whose landed sum is not the sum of the x they copied."""
        return int((self.sums != self.want).sum().item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    mod = build()
    cycles_per_us, step, seen = sm_clock(mod)
    print(f"device {torch.cuda.get_device_name()}; {ROWS} rows of x, {KC}-column stages, one CTA a multiprocessor; "
          f"medians of {a.launches} launches, then of {a.rounds} rounds; µs")
    print(f"SM clock {cycles_per_us:.0f} MHz over a 2^22-cycle spin; %globaltimer's smallest step {step:.3f} µs "
          f"({seen} distinct values in 65536 reads): first and last are timed in SM cycles, slowest by %globaltimer")
    print(f"{'K':>5} {'CTAs':>5} {'mode':>7} {'first':>7} {'last':>7} {'slowest':>8} {'GB/s a CTA':>11} "
          f"{'L2 GB/s':>8}", flush=True)
    ok = True
    for k in KS:
        for grid in GRIDS:
            cfgs = [Config(mod, k, grid, m) for m in MODES if not (m.startswith("mcast") and grid % int(m[5:]))]
            figs: dict[str, list[tuple[float, float, float]]] = {c.mode: [] for c in cfgs}
            for _ in range(a.rounds):
                for c in cfgs:
                    if not c.resident:
                        continue
                    runs = [r for r in (c.run(cycles_per_us) for _ in range(a.launches)) if r is not None]
                    if runs:
                        figs[c.mode].append(tuple(statistics.median(r[i] for r in runs) for i in range(3)))
            for c in cfgs:
                if not figs[c.mode]:
                    print(f"{k:>5} {grid:>5} {c.mode:>7}     n/a (its clusters are not all resident at once)")
                    continue
                bad = c.wrong()
                if bad:
                    print(f"FAIL {k} {grid} {c.mode}: {bad} of {grid} CTAs' landed sums differ from their x's")
                    ok = False
                    continue
                first, last, slowest = (statistics.median(f[i] for f in figs[c.mode]) for i in range(3))
                cta_bytes = ROWS * k * 2
                served = cta_bytes * grid / c.cluster
                print(f"{k:>5} {grid:>5} {c.mode:>7} {first:>7.2f} {last:>7.2f} {slowest:>8.2f} "
                      f"{cta_bytes / last / 1e3:>11.1f} {served / slowest / 1e3:>8.0f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
