#!/usr/bin/env python
"""One launch each of the decode attention and of its peer, cuDNN SDPA on the dense cache, inside NVTX
ranges, for Nsight Compute to profile side by side.

    ncu --nvtx --nvtx-include "ours_shuffled/" --nvtx-include "ours_inorder/" --nvtx-include "cudnn/" \\
        --metrics ... python benches/gpu/profile_decode_peer.py [--shapes 32x4096 33x4096 128x1024]

The problem is the decode lab's (qwen3-8b attention: 32 query heads, 8 KV heads, head_dim 128, one query a
sequence, pages of 16 tokens; ``probe_decode_cudnn.py``'s): ours through ``ops.split_kv_decode`` with the
engine's ``auto`` split over pages in one random order (``ours_shuffled``) and in order (``ours_inorder``),
cuDNN on the dense ``[B, n_kv, ctx, D]`` copy. Every call runs once outside the ranges first (CuPy's and
cuDNN's first-call work stays out of the profile), and ours is checked against cuDNN before the ranges
(within 1e-2: the two sum in other orders).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "benches" / "gpu"))

import torch  # noqa: E402

from _attn import sdpa_call  # noqa: E402
from probe_stream import BS, D, N_Q, dense_problem, ours, paged  # noqa: E402



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=["32x4096", "33x4096", "128x1024"])
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ok = True
    for shape in args.shapes:
        B, ctx = (int(x) for x in shape.split("x"))
        k, v, q, lens = dense_problem(B, ctx, gen)                                        # [B, ctx, n_kv, D], ...
        calls = {"ours_shuffled": ours(*paged(k, v, BS, True, gen), q, lens, ctx, sms),
                 "ours_inorder": ours(*paged(k, v, BS, False, gen), q, lens, ctx, sms)}
        kd, vd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()                # [B, n_kv, ctx, D]
        del k, v
        calls["cudnn"] = sdpa_call("cudnn", q[:, :, None], kd, vd, D ** -0.5, "none", "enable_gqa")  # [B, n_q, 1, D]
        outs = {name: fn().float().reshape(B, N_Q, D) for name, fn in calls.items()}          # the warm-up calls
        for name in ("ours_shuffled", "ours_inorder"):
            err = (outs[name] - outs["cudnn"]).abs().max().item()
            ok &= err <= 1e-2
            print(f"B={B} ctx={ctx} {name} vs cudnn: max |diff| {err:.3g}" + ("" if err <= 1e-2 else " DIFFER"))
        torch.cuda.synchronize()
        for name, fn in calls.items():
            torch.cuda.nvtx.range_push(name)
            fn()
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(f"B={B} ctx={ctx}: one launch each of {', '.join(calls)} profiled", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
