#!/usr/bin/env python
"""What does a kernel-to-kernel edge of the decode step cost, and would a flag in global memory cost less?
(fifty-ninth session; docs/performance/decode_step.md, "The edges between the step's kernels").

    python benches/gpu/probe_edge.py [--launches 64] [--reps 50] [--rounds 3]

The trace of the fifty-eighth session put 0.8-0.9 µs between one warpgroup GEMM's last CTA's end and the next one's
first CTA passing its PDL wait (``trace_wg.py``'s ``gap``), on three edges of every layer: about 70 µs of
qwen3-0.6b's batch-32 step. This probe isolates that edge. A CUDA graph of ``--launches`` launches of one small
kernel (``edge_probe.cu``: each adds 1 to 16384 floats, 128 threads a CTA), each launch with programmatic stream
serialization, in three modes: ``pdl`` (``griddepcontrol.wait``, the engine's edge), ``flag`` (a counter in global
memory, released by every CTA of the launch before after its stores and spun on by the next launch's CTAs),
``none`` (no wait: the launches' own pace, a floor whose results are wrong). Per mode and shape (CTAs, dynamic
shared memory a CTA: 200 KB leaves one CTA a multiprocessor, as the engine's GEMMs do) it prints, in µs:

* ``per launch``: a replay's time (CUDA events, ``--reps`` replays after warm-up) over its launches;
* ``gap``: the median over the chain of the next launch's first wait passed less this launch's last CTA's end
  (``%globaltimer`` marks from the last replay): the edge itself, as ``trace_wg.py`` measures it;
* ``period``: the median of first wait passed to the next launch's first wait passed.

``pdl`` and ``flag`` must end with every float equal to its start plus the launches; a shape's figures are printed
once its chains are checked (a mode that fails prints FAIL instead), shape by shape, so that a later shape's fault
leaves the earlier ones' rows. Modes alternate within each round; the table gives the medians of the rounds.
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

from optimized import launch  # noqa: E402

N = 16384
MODES = {"pdl": "edge_pdl", "flag": "edge_flag", "none": "edge_none"}
SHAPES = ((64, 200), (64, 0), (128, 0))      # (CTAs, KB of dynamic shared memory a CTA)


def edge_stats(marks: np.ndarray) -> tuple[float, float]:
    """The median gap and period, µs, of a chain's marks (``[launches, CTAs, 2]`` ns: each CTA's wait passed, end):
    the gap after launch s is launch s + 1's first wait passed less launch s's last end; the period is first wait
    passed to first wait passed."""
    m = marks.astype(np.float64) / 1000.0                            # [k, grid, 2] µs
    first_wait, last_end = m[:, :, 0].min(axis=1), m[:, :, 1].max(axis=1)
    gaps = first_wait[1:] - last_end[:-1]
    periods = first_wait[1:] - first_wait[:-1]
    return float(np.median(gaps)), float(np.median(periods))


class Chain:
    """One mode's graph: the flags' reset, then ``k`` launches buf[s] -> buf[s + 1]."""

    def __init__(self, fn, k: int, grid: int, smem_kb: int) -> None:
        self.k, self.grid = k, grid
        self.bufs = torch.zeros(k + 1, N, device="cuda")
        self.bufs[0].copy_(torch.arange(N, device="cuda", dtype=torch.float32) % 1000)
        self.flags = torch.zeros(k, dtype=torch.int32, device="cuda")
        self.marks = torch.zeros(k, grid, 2, dtype=torch.int64, device="cuda")
        smem = smem_kb * 1024
        fn.max_dynamic_shared_size_bytes = smem
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(self.graph, stream=s):
            self.flags.zero_()
            for i in range(k):
                args = (np.uint64(self.bufs[i].data_ptr()), np.uint64(self.bufs[i + 1].data_ptr()), np.int32(N),
                        np.uint64(self.flags.data_ptr()), np.int32(i), np.int32(grid),
                        np.uint64(self.marks.data_ptr()))
                launch.launch_pdl(fn.kernel.ptr, (grid,), (128,), args, smem, s.cuda_stream)
        torch.cuda.current_stream().wait_stream(s)

    def time(self, reps: int) -> float:
        """µs a launch over ``reps`` replays (after 5 warm-up replays)."""
        for _ in range(5):
            self.graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / (reps * self.k)

    def edges(self) -> tuple[float, float]:
        """The median gap and period of the last replay, µs."""
        return edge_stats(self.marks.cpu().numpy())

    def wrong(self) -> int:
        """Floats of the chain's end that are not its start plus ``k``."""
        return int((self.bufs[self.k] != self.bufs[0] + self.k).sum().item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import cupy
    src = Path(__file__).with_name("edge_probe.cu").read_text()
    mod = cupy.RawModule(code=src, options=("-std=c++17",))
    print(f"device {torch.cuda.get_device_name()}; {a.launches} launches a graph, {N} floats, 128 threads a CTA; "
          f"medians of {a.rounds} rounds, µs")
    ok = True
    print(f"{'mode':>6} {'CTAs':>5} {'KB':>4} {'per launch':>11} {'gap':>7} {'period':>7} {'wrong':>6}", flush=True)
    for grid, smem_kb in SHAPES:
        chains = {m: Chain(mod.get_function(k), a.launches, grid, smem_kb) for m, k in MODES.items()}
        figs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
        for _ in range(a.rounds):
            for m, ch in chains.items():
                t = ch.time(a.reps)
                figs[m].append((t, *ch.edges()))
        for m, ch in chains.items():
            bad = ch.wrong()
            if m != "none" and bad:
                print(f"FAIL {m} {grid} CTAs {smem_kb} KB: {bad} of {N} floats wrong after the chain")
                ok = False
                continue
            t, gap, period = (statistics.median(f[i] for f in figs[m]) for i in range(3))
            print(f"{m:>6} {grid:>5} {smem_kb:>4} {t:>11.3f} {gap:>7.3f} {period:>7.3f} {bad:>6}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
