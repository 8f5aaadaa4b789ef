#!/usr/bin/env python
"""How long does a warpgroup GEMM CTA's MMA phase take once its stages are in shared memory? (sixty-first session;
docs/performance/decode_step.md, "The edge probe, the x copies and the MMA chain after the wait").

    python benches/gpu/probe_mma.py [--launches 20]

``trace_wg.py`` at qwen3-0.6b batch 32 has 1.7 µs from a qkv or gate/up CTA's first stage landed to its last MMA
(8 stages of 128 columns; about 27 ns for each 16 columns), while the x copies alone land in well under half of
that (``probe_xload.py``) and a second accumulator chain changed nothing. This probe runs the consumer loop of
``skinny_wg.cu`` alone (``mma_probe.cu``) over stages already in shared memory: the engine's waits (``engine``),
no waits until the end (``free``), two chains (``chains``, at 32 and 64 rows) and each stage's group waited on
before the next stage (``wait0``: what ptxas's injected wait made of the engine's loop until the sixty-second
session), at 32 and 64 x rows (m64n32k16 and
m64n64k16) and, for how a wgmma's cost grows with its N, at 16, 128 and 256, on one CTA and on one CTA on each
multiprocessor. Per configuration it prints the median CTA's cycles (the SM's clock64)
for the stages, the cycles a wgmma, the µs at the SM clock measured first (``probe_xload.sm_clock``), and the
shared-memory bytes the wgmmas read a cycle (a 2 KB weight tile and an x tile of 32 bytes a row each). Every output of
every CTA must be exact (stages · 128, from bf16 ones); a configuration with a wrong output prints FAIL.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches" / "gpu"), str(ROOT / "benches")]

from ab_attention import build  # noqa: E402
from probe_xload import sm_clock  # noqa: E402

from optimized import launch  # noqa: E402

SMEM = 200 * 1024
#: the wgmma's N (x rows in the engine: 32 or 64) -> stages that fit 200 KB (the engine's 8 at 32 rows)
STAGES = {16: 8, 32: 8, 64: 6, 128: 4, 256: 2}
MODES = {n: ("engine", "free", "chains", "wait0") if n in (32, 64) else ("engine", "free") for n in STAGES}


def wgmma_stats(cycles: np.ndarray, stages: int, rows: int, mhz: float) -> tuple[float, float, float, float]:
    """(median cycles, cycles a wgmma, µs, shared-memory bytes read a cycle) of one configuration's ``cycles``
    (every launch's every CTA) for ``stages`` stages of eight wgmmas at ``rows`` x rows, at ``mhz``."""
    med = float(np.median(cycles))
    n = stages * 8
    bytes_read = n * (64 * 16 * 2 + rows * 16 * 2)
    return med, med / n, med / mhz, bytes_read / med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=20)
    a = ap.parse_args()
    mhz, step, _ = sm_clock()
    mod = build(Path(__file__).with_name("mma_probe.cu").read_text(), name="skinny_wg")   # its sm_90a target
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device {torch.cuda.get_device_name()}; SM clock {mhz:.0f} MHz (%globaltimer step {step:.3f} µs); "
          f"medians over {a.launches} launches' CTAs")
    print(f"{'N':>6} {'stages':>6} {'mode':>7} {'CTAs':>5} {'cycles':>8} {'a wgmma':>8} {'µs':>7} "
          f"{'B/cycle':>8}", flush=True)
    ok = True
    for rows, stages in STAGES.items():
        for mode in MODES[rows]:
            fn = mod.get_function(f"mma_n{rows}_{mode}")
            fn.max_dynamic_shared_size_bytes = SMEM
            for grid in (1, sms):
                cycles = torch.zeros(grid, dtype=torch.int64, device="cuda")
                wrong = torch.zeros(grid, dtype=torch.int32, device="cuda")
                seen, bad = [], 0
                for _ in range(a.launches):
                    wrong.zero_()
                    launch.launch_pdl(fn.kernel.ptr, (grid,), (128,),
                                      (np.int32(stages), np.uint64(cycles.data_ptr()), np.uint64(wrong.data_ptr())),
                                      SMEM, torch.cuda.current_stream().cuda_stream)
                    seen += cycles.cpu().tolist()
                    bad += int(wrong.sum().item())
                if bad:
                    print(f"FAIL {rows} rows {mode} {grid} CTAs: {bad} outputs not {stages * 128}")
                    ok = False
                    continue
                med, per, us, bpc = wgmma_stats(np.array(seen), stages, rows, mhz)
                print(f"{rows:>6} {stages:>6} {mode:>7} {grid:>5} {med:>8.0f} {per:>8.1f} {us:>7.3f} {bpc:>8.1f}",
                      flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
