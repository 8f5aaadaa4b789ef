#!/usr/bin/env python
"""Where the decode attention's read stream loses against cuDNN's at large batch: the same bytes
read through different layouts, by our kernel, by cuDNN and by plain torch streams, in one process.

    python benches/gpu/probe_stream.py [--ctx 4096] [--batch 32 128] [--rounds 3] [--reps 20]

For each batch (qwen3-8b attention: 32 query heads, 8 KV heads, head_dim 128; K + V bytes
``2 * B * ctx * 8 * 128 * 2``) it times, best of ``--rounds`` (CUDA graphs of ``--reps`` calls):

* ``ours NHD shuffled``: ``split_kv_decode`` (the engine's ``auto`` split) over the engine's layout
  ``[N, 16, n_kv, D]`` in shuffled pages (the lab's problem): a CTA reads 256-byte rows 2 KiB apart;
* ``ours NHD in order``: the same with every sequence's pages consecutive;
* ``ours kv1 shuffled``: the same bytes as ``8 B`` sequences of one KV head (4 query heads): a CTA reads
  each page's 4 KiB whole -- the access pattern an ``[N, n_kv, 16, D]`` (HND) layout would give;
* ``ours kv1 bs64``: one KV head, pages of 64 tokens (16 KiB a page);
* ``cudnn BHSD``: SDPA's cuDNN backend over the dense contiguous ``[B, n_kv, ctx, D]`` (the lab's peer);
* ``torch sum`` / ``torch copy``: a read-only reduction and a device-to-device copy of as many bytes.

Each attention output is checked against the first one on the same keys (same values, different
layouts) before timing: max abs difference printed, and a failure when above 1e-2 (bf16 output of
the same math; the layouts only permute where the keys live).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import torch  # noqa: E402

from _attn import sdpa_call  # noqa: E402
from ab_attention import build, install  # noqa: E402
from check_kernels import _time as gpu_seconds  # noqa: E402
from optimized import kernels, ops  # noqa: E402
from reference.attention import split_size_for  # noqa: E402

N_Q, N_KV, D = 32, 8, 128
BS = 16  # tokens a page, the lab's


def paged_at(k: torch.Tensor, v: torch.Tensor, bs: int, order: torch.Tensor):
    """Dense ``k, v [B, ctx, h, D]`` as pages of ``bs`` tokens, page i of the concatenated sequences at
    ``order[i]``: caches ``[N, bs, h, D]``, tables ``[B, nblk]``."""
    B, ctx, h, _ = k.shape
    nblk = ctx // bs
    n = B * nblk
    kc = torch.empty(n, bs, h, D, device=k.device, dtype=k.dtype)
    vc = torch.empty_like(kc)
    kc[order] = k.reshape(n, bs, h, D)
    vc[order] = v.reshape(n, bs, h, D)
    return kc, vc, order.view(B, nblk).to(torch.int32)


def paged(k: torch.Tensor, v: torch.Tensor, bs: int, shuffle: bool, gen: torch.Generator):
    """``paged_at`` with the pages in one random order (``shuffle``) or in order."""
    n = k.shape[0] * (k.shape[1] // bs)
    order = torch.randperm(n, device=k.device, generator=gen) if shuffle else torch.arange(n, device=k.device)
    return paged_at(k, v, bs, order)


def dense_problem(B: int, ctx: int, gen: torch.Generator):
    """The lab's decode problem, dense: ``k, v [B, ctx, n_kv, D]``, ``q [B, n_q, D]`` (bf16, drawn in that
    order from ``gen``) and ``lens [B]`` (every sequence ``ctx`` keys)."""
    k = torch.randn(B, ctx, N_KV, D, device="cuda", generator=gen).to(torch.bfloat16)   # [B, ctx, n_kv, D]
    v = torch.randn(B, ctx, N_KV, D, device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn(B, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)          # [B, n_q, D]
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    return k, v, q, lens


def ours(kc, vc, tables, q, lens, ctx: int, sms: int):
    """The engine's launch of ``split_kv_decode`` (``auto`` split) on one paged problem."""
    size = split_size_for("auto", 0, [ctx] * q.shape[0], kc.shape[2], sms)
    n = 1 if size is None else -(-ctx // size)
    return lambda: ops.split_kv_decode(q, kc, vc, tables, lens, size, max_splits=n)


def probe(B: int, ctx: int, rounds: int, reps: int, gen: torch.Generator, sms: int) -> bool:
    k, v, q, lens = dense_problem(B, ctx, gen)
    gbytes = 2 * k.numel() * 2 / 1e9
    same = lambda o: o  # noqa: E731
    calls = {"ours NHD shuffled": (ours(*paged(k, v, BS, True, gen), q, lens, ctx, sms), same),
             "ours NHD in order": (ours(*paged(k, v, BS, False, gen), q, lens, ctx, sms), same)}
    # one KV head per "sequence": [B, ctx, 8, D] -> [B * 8, ctx, 1, D]
    k1 = k.permute(0, 2, 1, 3).reshape(B * N_KV, ctx, 1, D)
    v1 = v.permute(0, 2, 1, 3).reshape(B * N_KV, ctx, 1, D)
    q1 = q.view(B * N_KV, N_Q // N_KV, D)                       # query heads 4h..4h+3 see KV head h
    lens1 = torch.full((B * N_KV,), ctx, dtype=torch.int32, device="cuda")
    back = lambda o: o.view(B, N_Q, D)  # noqa: E731
    calls["ours kv1 shuffled"] = (ours(*paged(k1, v1, BS, True, gen), q1, lens1, ctx, sms), back)
    calls["ours kv1 bs64"] = (ours(*paged(k1, v1, 64, True, gen), q1, lens1, ctx, sms), back)
    del k1, v1
    kd, vd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()          # [B, n_kv, ctx, D]
    calls["cudnn BHSD"] = (sdpa_call("cudnn", q[:, :, None], kd, vd, D ** -0.5, "none", "enable_gqa"),
                           lambda o: o[:, :, 0])
    ok = True
    first = None
    for name, (fn, view) in calls.items():
        out = view(fn()).float()
        first = out if first is None else first
        err = (out - first).abs().max().item()
        print(f"B={B} ctx={ctx} {name}: max |out - first| = {err:.3g}", flush=True)
        ok &= err <= 1e-2
    flat = torch.cat([k.view(-1), v.view(-1)])
    dst = torch.empty_like(flat)
    calls["torch sum"] = (lambda: flat.sum(dtype=torch.float32), same)
    calls["torch copy"] = (lambda: dst.copy_(flat), same)
    if not rounds:
        return ok
    best = {name: float("inf") for name in calls}
    for _ in range(rounds):
        for name, (fn, _) in calls.items():
            best[name] = min(best[name], gpu_seconds(fn, iters=reps) * 1e6)
    for name, us in best.items():
        print(f"B={B} ctx={ctx} {name:20s} {us:9.1f} us  {gbytes / (us * 1e-6) / 1e3:6.3f} TB/s read"
              + ("  (copy: read + write = twice this)" if name == "torch copy" else ""), flush=True)
    return ok


def set_carveout(percent: int) -> None:
    """The preferred shared-memory carveout (percent of the largest; -1: the driver's default) of the
    decode kernel the probe runs (head_dim ``D``), set on the kernel ``optimized.ops`` launches (the
    attribute its launch sets to ``ops._carveout_percent`` of two CTAs; this overrides it)."""
    fn, _ = ops._function(torch.cuda.current_device(), "attention", f"split_kv_partials_d{D}", ops.decode_smem_bytes(D),
                          ops.DECODE_CTAS_PER_SM)
    fn.preferred_shared_memory_carveout = percent
    print(f"decode kernel (head_dim {D}): preferred shared-memory carveout {percent}%", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--batch", type=int, nargs="*", default=[32, 128])
    ap.add_argument("--rounds", type=int, default=3, help="0: only the agreement checks (for Nsight Compute)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--define", nargs="*", default=[],
                    help="compile attention.cu with these macros (-DNAME) and run that build (e.g. TK_CP_ASYNC_CG)")
    ap.add_argument("--carveout", type=int, default=None,
                    help="the decode kernels' preferred shared-memory carveout, percent (-1: driver default)")
    a = ap.parse_args()
    if a.define:
        install(build(kernels.source("attention"), a.define))
        print(f"attention.cu built with {' '.join('-D' + d for d in a.define)}", flush=True)
    if a.carveout is not None:
        set_carveout(a.carveout)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ok = True
    for B in a.batch:
        ok &= probe(B, a.ctx, a.rounds, a.reps, gen, sms)
        torch.cuda.empty_cache()
    print("all layouts agree" if ok else "LAYOUTS DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
