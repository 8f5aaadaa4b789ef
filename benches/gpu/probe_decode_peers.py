#!/usr/bin/env python
"""The decode attention against other paged decode kernels on the same pages, with cuDNN on the dense cache
beside them, in one process.

    python benches/gpu/probe_decode_peers.py [--shapes 32x4096 128x1024 ...] [--rounds 3] [--reps 20]
        [--peers PEER ...]   # default: all of PEERS (fi-cc fi-cc-g fi-tc fi-tc-g fi-fa3-g fi-cc-hnd fi-tc-hnd cudnn-paged)

The problem is the decode lab's (qwen3-8b attention: 32 query heads, 8 KV heads, head_dim 128, one query a
sequence, every sequence ``ctx`` keys, pages of 16 tokens; ``probe_stream.dense_problem``). Issue 5's target
compares the engine's kernel over its paged cache with cuDNN SDPA over a dense cache. This probe asks what the
paged problem costs other kernels built for it: where the engine trails cuDNN-on-dense, do they too?

* ``ours``: ``ops.split_kv_decode`` with the engine's ``auto`` split, over the engine's ``[N, 16, n_kv, D]``
  (NHD) pages, in one random order over the cache (``shuffled``, the lab's problem) and in order (``inorder``).
* ``fi-*``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` (the decode kernel vLLM and SGLang call) over
  the very same page tensors and tables (``kv_layout="NHD"``, the same bytes at the same addresses): ``cc``
  its CUDA-core decode kernel, ``tc`` ``use_tensor_cores=True`` (its fa2 prefill kernel, which it recommends
  for grouped-query heads), ``fa3`` that with ``backend="fa3"`` (its Hopper kernel); ``-g``: the wrapper made
  with ``use_cuda_graph=True``, as serving engines make it for their graphs (its plan then fixes the grid);
  ``-hnd``: over ``[N, n_kv, 16, D]`` (HND) copies of the pages, FlashInfer's other layout (the same page
  order; ``shuffled-hnd``, ``inorder-hnd``).
* ``cudnn-paged``: cuDNN's own paged SDPA decode (FlashInfer's ``cudnn_batch_decode_with_kv_cache``, through
  cudnn-frontend), which takes ``[N, n_kv, 16, D]`` (HND) pages: the same keys, the same page order, each
  page's heads laid out as that layout wants (``shuffled-hnd``, ``inorder-hnd``).
* ``cudnn``: SDPA's cuDNN backend on the dense ``[B, n_kv, ctx, D]`` copy (the lab's peer, the target's).

FlashInfer and cudnn-frontend are not the project's dependencies: the device script
(``h200_peers_round.sh``) brings them as carried wheels, and a peer that cannot be imported, planned or run
is reported as such and left out, never counted. Every output is checked before timing: ``ours`` in order
bitwise against ``ours`` shuffled, each peer against ``ours`` shuffled within 1e-2 (another reduction order:
the bound ``probe_decode_cudnn.py`` uses for other splits), printing max and mean; a peer over the bound is
not timed. Then rounds alternate over every call, each timed as a CUDA graph of ``--reps`` calls (CUDA events
after warm-up; 0.27-2.1 GB of keys a call, so they come from DRAM), best round kept.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "benches" / "gpu"))

import torch  # noqa: E402

from _attn import sdpa_call  # noqa: E402
from check_kernels import _time as gpu_seconds  # noqa: E402
from probe_stream import BS, D, N_KV, N_Q, dense_problem, ours, paged_at  # noqa: E402

BOUND = 1e-2  # max |peer - ours| allowed: another reduction order of the same softmax (bf16 outputs)
PEERS = ("fi-cc", "fi-cc-g", "fi-tc", "fi-tc-g", "fi-fa3-g", "fi-cc-hnd", "fi-tc-hnd", "cudnn-paged")
WORKSPACE = 256 << 20  # bytes of FlashInfer's float workspace (its docs: 128 MB suffices for decode)


def hnd_pages(kc, vc):
    """The same pages with each page's heads outermost: ``[N, n_kv, 16, D]`` (HND), page i still page i."""
    return kc.permute(0, 2, 1, 3).contiguous(), vc.permute(0, 2, 1, 3).contiguous()


def uses_hnd(peer: str) -> bool:
    """Whether ``peer`` reads HND copies of the pages (else the engine's NHD pages themselves)."""
    return peer == "cudnn-paged" or peer.endswith("-hnd")


def flashinfer_decode(fi, kc, vc, tables, q, peer: str):
    """A closure running FlashInfer's batch decode on pages ``kc, vc``: the engine's NHD ``[N, 16, n_kv, D]``, or
    for ``-hnd`` peers their HND copies ``[N, n_kv, 16, D]``, with block table ``tables [B, nblk]`` (every sequence
    full pages)."""
    B, nblk = tables.shape
    dev = q.device
    indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * nblk     # [B + 1]
    indices = tables.reshape(-1).contiguous()                                # [B * nblk]
    last = torch.full((B,), BS, dtype=torch.int32, device=dev)              # [B]
    ws = torch.zeros(WORKSPACE, dtype=torch.uint8, device=dev)
    graph = peer.endswith("-g")
    kw = {"use_tensor_cores": "-tc" in peer or "-fa3" in peer, "use_cuda_graph": graph}
    if "-fa3" in peer:
        kw["backend"] = "fa3"
    if graph:
        kw.update(paged_kv_indptr_buffer=indptr.clone(), paged_kv_indices_buffer=indices.clone(),
                  paged_kv_last_page_len_buffer=last.clone())
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "HND" if uses_hnd(peer) else "NHD", **kw)
    w.plan(indptr, indices, last, N_Q, N_KV, D, BS, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
           sm_scale=D**-0.5)
    out = torch.empty_like(q)                                                # [B, n_q, D]
    return lambda: w.run(q, (kc, vc), out=out)


def cudnn_paged_decode(kh, vh, tables, q, ctx: int):
    """A closure running cuDNN's paged decode SDPA (through FlashInfer's wrapper) on HND pages
    ``kh, vh [N, n_kv, 16, D]``."""
    from flashinfer.cudnn.decode import cudnn_batch_decode_with_kv_cache

    B = q.shape[0]
    lens = torch.full((B,), ctx, dtype=torch.int32, device=q.device)
    ws = torch.zeros(WORKSPACE, dtype=torch.uint8, device=q.device)
    out = torch.empty_like(q)
    return lambda: cudnn_batch_decode_with_kv_cache(
        q, kh, vh, D**-0.5, ws, max_sequence_kv=ctx, actual_seq_lens_kv=lens, block_tables=tables,
        is_cuda_graph_compatible=True, out=out)


def probe(B: int, ctx: int, peers: list[str], fi, rounds: int, reps: int, gen: torch.Generator, sms: int) -> bool:
    k, v, q, lens = dense_problem(B, ctx, gen)                               # [B, ctx, n_kv, D], [B, n_q, D]
    gbytes = 2 * k.numel() * 2 / 1e9
    n = B * (ctx // BS)
    pages = {"shuffled": paged_at(k, v, BS, torch.randperm(n, device="cuda", generator=gen)),
             "inorder": paged_at(k, v, BS, torch.arange(n, device="cuda"))}
    kd, vd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # [B, n_kv, ctx, D]
    del k, v
    calls = {("ours", lay): ours(*pages[lay], q, lens, ctx, sms) for lay in pages}
    if any(uses_hnd(peer) for peer in peers):  # one HND copy of each layout, shared by the peers that read it
        for lay in list(pages):
            kc, vc, tables = pages[lay]
            pages[lay + "-hnd"] = (*hnd_pages(kc, vc), tables)                 # [N, n_kv, 16, D]
    dense = sdpa_call("cudnn", q[:, :, None], kd, vd, D**-0.5, "none", "enable_gqa")
    calls[("cudnn", "dense")] = lambda: dense()[:, :, 0]
    for peer in peers:
        for lay in ("shuffled", "inorder"):
            name = lay + "-hnd" if uses_hnd(peer) else lay
            try:
                if peer == "cudnn-paged":
                    calls[(peer, name)] = cudnn_paged_decode(*pages[name], q, ctx)
                else:
                    if fi is None:
                        raise RuntimeError("flashinfer not importable")
                    calls[(peer, name)] = flashinfer_decode(fi, *pages[name], q, peer)
            except Exception as e:  # noqa: BLE001 (a peer that cannot plan is reported, not counted)
                print(f"B={B} ctx={ctx} {peer} {name}: NOT RUN ({type(e).__name__}: {str(e)[:300]})", flush=True)
    ref = calls[("ours", "shuffled")]().clone()
    ok = True
    timed = {}
    for key, fn in calls.items():
        try:
            out = fn().view(ref.shape)
        except Exception as e:  # noqa: BLE001
            print(f"B={B} ctx={ctx} {key[0]} {key[1]}: NOT RUN ({type(e).__name__}: {str(e)[:300]})", flush=True)
            traceback.print_exc(limit=3)
            continue
        if key[0] == "ours":
            same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
            ok &= same
            print(f"B={B} ctx={ctx} ours {key[1]}: bits {'equal' if same else 'DIFFER'} to ours shuffled", flush=True)
            timed[key] = fn
            continue
        err = (out.float() - ref.float()).abs()
        mx, mean = err.max().item(), err.mean().item()
        good = mx <= BOUND and bool(torch.isfinite(out).all())
        print(f"B={B} ctx={ctx} {key[0]} {key[1]}: max |out - ours| {mx:.3g}, mean {mean:.3g}"
              + ("" if good else f"  FAILS the check (bound {BOUND}): not timed"), flush=True)
        if good:
            timed[key] = fn
    if not rounds:
        return ok
    best = {key: float("inf") for key in timed}
    for _ in range(rounds):
        for key, fn in timed.items():
            best[key] = min(best[key], gpu_seconds(fn, iters=reps) * 1e6)
    c, o = best[("cudnn", "dense")], best[("ours", "shuffled")]
    for (name, lay), us in best.items():
        print(f"B={B} ctx={ctx} {name:11s} {lay:12s} {us:9.1f} us  {gbytes / (us * 1e-6) / 1e3:6.3f} TB/s read"
              f"  cuDNN-dense/this {c / us:6.3f}  ours-shuffled/this {o / us:6.3f}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=["8x4096", "32x4096", "32x8192", "32x16384", "128x1024", "128x4096"])
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    try:
        import flashinfer as fi

        print(f"flashinfer {fi.__version__}", flush=True)
    except Exception as e:  # noqa: BLE001
        fi = None
        print(f"flashinfer: not importable ({type(e).__name__}: {e}); its peers are not run", flush=True)
    try:
        import cudnn

        print(f"cudnn-frontend {getattr(cudnn, '__version__', '?')}, cuDNN {cudnn.backend_version()}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"cudnn-frontend: not importable ({type(e).__name__}: {e})", flush=True)
    print(f"torch {torch.__version__}, SDPA's cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ok = True
    for shape in a.shapes:
        B, ctx = (int(x) for x in shape.split("x"))
        if ctx % BS:
            raise SystemExit(f"context {ctx} is not a whole number of pages of {BS}")
        ok &= probe(B, ctx, a.peers, fi, a.rounds, a.reps, gen, sms)
        torch.cuda.empty_cache()
    print("ours bitwise equal over both layouts" if ok else "OURS DIFFERS BETWEEN LAYOUTS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
