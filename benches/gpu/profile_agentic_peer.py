#!/usr/bin/env python
"""How busy the agentic bench's transformers peer keeps the GPU: one turn of ``generate`` timed plain, then the same
turn under ``torch.profiler``, whose kernel records give the GPU's busy time.

    python benches/gpu/profile_agentic_peer.py [--turns 2] [--rounds 2] [--sdpa BACKENDS] [--scale cpu]

The workload is ``benches/test_agentic.py``'s at the GPU scale (qwen3-0.6b, random weights, 64 sequences, prompt
1024, observation 256, 128 tokens a turn, greedy), through the bench's own ``Workload.transformers`` pieces: one
``generate`` call over the 64 sequences a turn, the ``DynamicCache`` kept across turns (the "transformers + cache"
variant). After a warm-up (2 turns of 3 tokens), for each of ``--turns`` turns (turn 1: the prompt's prefill and 127
decode steps; later turns: the observation's prefill over the kept cache and 127 steps):

* ``wall s``: the turn without the profiler (host clock, device synced before and after);
* ``busy s``: the union of the GPU's kernel intervals in the same turn run again under the profiler (from the turn's
  start state: the cache is copied before the plain run), and ``busy / wall``;
* ``kernels`` and ``kernels a step``: the kernel launches of that turn, and per generated token;
* ``host us a kernel``: (wall - busy) / kernels, the host time a launch costs beyond the GPU's work;
* ``cudaMallocs`` and ``allocator retries``: the caching allocator's calls to ``cudaMalloc`` in the plain run, and its
  retries there (``device_allocs``);
* after the table, the kernels of most GPU time in turn 1's first profile (``--top``).

``--sdpa`` limits the backends SDPA may pick (``_bench.sdpa_backends``; by default torch's own choice, unlike the
benches' transformers peer, ``--hf-sdpa``), to tell whether a backend's per-shape setup makes a
turn's first run slow.

A peer whose busy share is small is set by the host's CPU: its time moves with the host and with whatever else the
host runs, not with the card. The two runs of a turn must give the same tokens (checked). The host's CPU model is
printed, and the host's time to launch one small op (``launch_us``), so that runs on different hosts can be told
apart. ``--scale cpu`` runs the bench's CPU workload (the tiny model) as a dry run of this script's plumbing: the CPU
has no kernel records, so its busy time reads 0.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import torch  # noqa: E402

from _bench import Scale, alloc_retries, hf_generate, host_cpu, peer_sdpa  # noqa: E402
from test_agentic import GEN, WARM_GEN, Workload  # noqa: E402


def busy_seconds(prof) -> tuple[float, int]:
    """The union of the profile's GPU kernel intervals (s) and the count of kernels."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end = 0.0, None
    for a, b in spans:
        if end is None or a >= end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return busy / 1e6, len(spans)


def launch_us(scale: Scale, launches: int = 20000) -> float:
    """The host's time to launch one small op (an in-place add on a one-element tensor; the device synced after the
    loop), best of 3: the host's speed at the work that bounds a launch-bound peer."""
    x = torch.zeros(1, device=scale.device)
    best = float("inf")
    for _ in range(3):
        scale.sync()
        t0 = time.perf_counter()
        for _ in range(launches):
            x.add_(1.0)
        scale.sync()
        best = min(best, time.perf_counter() - t0)
    return best / launches * 1e6


def device_allocs(scale: Scale) -> tuple[int, int]:
    """The caching allocator's ``cudaMalloc`` calls and its retries (``alloc_retries``) so far; (0, 0) on the CPU."""
    if not scale.gpu:
        return 0, 0
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0)), alloc_retries(scale)


def top_kernels(prof, n: int) -> list[tuple[str, int, float]]:
    """The profile's ``n`` kernels of most GPU time: (name, launches, ms), most first (which SDPA backend ran shows in
    the attention kernels' names)."""
    rows = [(e.key, e.count, e.device_time_total / 1e3) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(rows, key=lambda r: -r[2])[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=2, help="turns measured (1: only the first)")
    ap.add_argument("--rounds", type=int, default=2, help="plain + profiled pairs of each turn")
    ap.add_argument("--top", type=int, default=12, help="kernels listed from turn 1's first profile")
    ap.add_argument("--sdpa", default="torch", help="the SDPA backends transformers may pick, comma-separated, or "
                                                    "'torch' (default): torch's own choice")
    ap.add_argument("--scale", choices=("gpu", "cpu"), default="gpu", help="cpu: a dry run on the tiny model")
    args = ap.parse_args()
    try:
        sdpa = peer_sdpa(args.sdpa)
    except ValueError as e:
        raise SystemExit(f"--sdpa: {e}") from None
    scale = Scale(args.scale, peer_sdpa=sdpa)                     # hf_generate runs under these backends
    work = Workload(scale)
    hf = work.hf()
    gen = GEN[scale.name]
    card = torch.cuda.get_device_name() if scale.gpu else "no GPU"
    print(f"host CPU: {host_cpu()} ({len(os.sched_getaffinity(0))} usable cores) | {card} | torch "
          f"{torch.__version__} | one small op's launch: {launch_us(scale):.2f} us | SDPA backends: "
          f"{sdpa or 'torch default'}", flush=True)
    ids, obs = work.peer_inputs(args.turns)                        # [64, 1024 + 256], args.turns x [64, 256]
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if scale.gpu else [])
    tops: list[tuple[str, int, float]] = []
    out, cache = hf_generate(hf, ids, WARM_GEN)                # warm-up: 2 short turns over a cache
    hf_generate(hf, torch.cat([out, obs[0]], 1), WARM_GEN, cache=cache)
    print("| turn | round | wall s | busy s | busy / wall | kernels | kernels a step | host us a kernel | "
          "cudaMallocs | allocator retries |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    cache = None                                               # the cache at the start of turn k
    for k in range(args.turns):
        for r in range(args.rounds):
            start = copy.deepcopy(cache)
            scale.sync()
            a0 = device_allocs(scale)
            t0 = time.perf_counter()
            seq, new_cache = hf_generate(hf, ids, gen, cache=start)
            scale.sync()
            wall = time.perf_counter() - t0
            mallocs, retries = (b - a for a, b in zip(a0, device_allocs(scale)))
            start = copy.deepcopy(cache)
            scale.sync()
            with torch.profiler.profile(activities=activities) as prof:
                seq2, _ = hf_generate(hf, ids, gen, cache=start)
                scale.sync()
            assert torch.equal(seq, seq2), f"turn {k + 1}: the profiled run gave other tokens"
            busy, kernels = busy_seconds(prof)
            if k == 0 and r == 0:
                tops = top_kernels(prof, args.top)
            print(f"| {k + 1} | {r + 1} | {wall:.3f} | {busy:.3f} | {busy / wall:.3f} | {kernels} | "
                  f"{kernels / gen:.0f} | {(wall - busy) / max(kernels, 1) * 1e6:.1f} | {mallocs} | {retries} |",
                  flush=True)
            del prof, start
        cache = new_cache
        if k + 1 < args.turns:
            ids = torch.cat([seq, obs[k + 1]], 1)              # the next turn: this one's tokens + observation
    print(f"\nturn 1, first profile: the {len(tops)} kernels of most GPU time (name, launches, ms)")
    for name, count, ms in tops:
        print(f"  {ms:10.1f} ms {count:8d}x  {name[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
