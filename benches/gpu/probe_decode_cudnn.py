#!/usr/bin/env python
"""The decode attention at large batch against cuDNN, in one process: where the pages lie, how many
splits a sequence takes, and builds of ``attention.cu`` with compile-time switches.

    python benches/gpu/probe_decode_cudnn.py [--shapes 32x4096 128x1024 ...] [--rounds 3] [--reps 20]
        [--variants base cg:TK_CP_ASYNC_CG ...] [--layouts shuffled inorder local] [--splits 2 4]
        [--block-sizes 16 64 ...] [--split-sizes 3968 ...]

The problem is the decode lab's (qwen3-8b attention: 32 query heads, 8 KV heads, head_dim 128, one
query a sequence, every sequence ``ctx`` keys, pages of 16 tokens) through ``ops.split_kv_decode`` with
the engine's ``auto`` split. Layouts of the same keys:

* ``shuffled``: the pages of all sequences in one random order (the lab's problem);
* ``inorder``: every sequence's pages consecutive (a dense cache, read through the block table);
* ``local``: shuffled only within runs of 64 consecutive pages (2 MiB of K), so a sequence's pages
  stay in the same 2 MiB regions as in order: if ``local`` runs like ``inorder``, what the shuffle
  costs is the spread over memory regions (address translation), not the order of the pages;
* ``grown``: as the engine's allocator lays out a batch that prefilled its prompts (each sequence's first
  quarter, in one run) and then decoded in step (the rest, one page a sequence in turn: ``grown_order``).

``hnd`` and ``hnd-inorder`` (shuffled and in order) hold every KV head of a sequence as a sequence of its own,
``B * n_kv`` sequences of one KV head and its 4 query heads: a page is then 16 keys of one head, 4 KiB in one
piece, as in an ``[N, n_kv, block_size, D]`` (HND) cache, and ``hnd-inorder`` is each CTA's keys in one contiguous
run, as in cuDNN's dense ``[B, n_kv, ctx, D]``. The grid and every CTA's arithmetic are the same, so the bits too.

``--block-sizes`` lays the same keys out in pages of other sizes too (the engine's ``block_size``; each
layout at ``N`` tokens a page is named ``layout@N``, at 16 just ``layout``; ``local`` keeps its runs at
2 MiB of K). The kernel's arithmetic does not depend on the page size, so these must give ``base``'s bits.

``--splits N ...`` adds the engine's build on ``shuffled`` pages with N splits a sequence in place of
``auto``'s count (``base/sN``; ``ctx / N`` keys a split, folded in the same launch; other splits give
other bits, so these are checked to within 1e-2 of ``base``, as ``probe_stream.py`` checks its layouts).
``--split-sizes S ...`` adds, for every variant, the build on ``shuffled`` pages with splits of ``S`` keys
(``name/kS``: ``ceil(ctx / S)`` splits a sequence, the last one short when ``S`` does not divide ``ctx``, folded
in the same launch; ``S <= 0`` stands for ``ctx + S``, so ``-128`` is two 64-key tiles short of every shape's
context). Base's are checked to within 1e-2 of ``base``, another variant's bitwise against base's at the same
``S``. A variant built with ``TK_SPLIT_SLOWEST`` is launched with the split as the grid's slowest index
(``(B, n_kv * HG, splits)`` in place of ``(splits, n_kv * HG, B)``), so every sequence's first split is
dispatched before any second: with ``S`` a few tiles short of ``ctx`` at batch 32 (256 full CTAs for 264 slots
of two a multiprocessor), the short remainders can run in the 8 empty slots while the long splits stream.
``cudnn`` is SDPA's cuDNN backend on the dense ``[B, n_kv, ctx, D]`` copy (the lab's peer).

A variant is ``name:MACRO[=V],MACRO...`` (``base``: the engine's build), for switches that change how the
keys are fetched and no value (a cache operator, a prefetch). Every variant's output on every layout is
checked against ``base`` on ``shuffled`` before any timing: the bits must be equal; the probe fails
otherwise. Then rounds alternate over every (variant, layout) and cuDNN, each timed as a CUDA graph of
``--reps`` calls (CUDA events, after warm-up; 0.27-2.1 GB of keys a call, so they come from DRAM), best
round kept. (The twenty-fifth session ran it, as ``probe_decode_l2.py``, with two switches that have left
the tree since: an L2 prefetch and tensor copies, commit 6ead9e2; docs/performance/decode_attention.md, "Decode attention".)
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
from ab_attention import build, install  # noqa: E402
from check_kernels import _time as gpu_seconds  # noqa: E402
from optimized import kernels, ops  # noqa: E402
from probe_stream import BS, D, N_KV, dense_problem, ours, paged_at  # noqa: E402

GROUP = 64  # pages of a `local` run: 64 x 16 tokens x 8 heads x 128 dims x 2 bytes = 2 MiB of K


def page_order(n: int, layout: str, gen: torch.Generator, group: int = GROUP, per_seq: int = 0,
               device: str = "cuda") -> torch.Tensor:
    """Where page i of the concatenated sequences lies: a permutation of ``range(n)`` (``local``: shuffled
    within runs of ``group`` pages; ``grown``: sequences of ``per_seq`` pages, see ``grown_order``)."""
    if layout == "inorder":
        return torch.arange(n, device=device)
    if layout == "grown":
        return grown_order(n // per_seq, per_seq, device)
    if layout == "shuffled":
        return torch.randperm(n, device=device, generator=gen)
    assert layout == "local", layout
    order = torch.arange(n, device=device)
    for g0 in range(0, n, group):
        g1 = min(n, g0 + group)
        order[g0:g1] = g0 + torch.randperm(g1 - g0, device=device, generator=gen)
    return order


def grown_order(batch: int, per_seq: int, device: str = "cuda") -> torch.Tensor:
    """The pages of ``batch`` sequences as the engine's first-in-first-out allocator lays them out when the batch
    prefills a prompt and then decodes in step: each sequence's first quarter (its prompt) in one run, the prompts
    one after another, then the rest dealt one page a sequence in turn, so a sequence's generated pages lie
    ``batch`` pages apart (the forty-eighth session found this pattern in the agentic workload's block tables)."""
    m0 = per_seq // 4
    seq = torch.arange(batch, device=device)[:, None]  # [B, 1]
    j = torch.arange(per_seq, device=device)[None, :]  # [1, m]
    prompt = seq * m0 + j  # [B, m]
    grown = batch * m0 + (j - m0) * batch + seq  # [B, m]
    return torch.where(j < m0, prompt, grown).reshape(-1)  # [B * m]


def parse_variants(specs: list[str]) -> dict[str, tuple[str, ...]]:
    out = {}
    for spec in specs:
        name, _, macros = spec.partition(":")
        out[name] = tuple(m for m in macros.split(",") if m)
    if "base" not in out:
        out = {"base": (), **out}
    return out


def sized(kc, vc, tables, q, lens, ctx: int, size: int, n: int | None = None):
    """``split_kv_decode`` with splits of ``size`` keys, ``n`` of them a sequence (default ``ceil(ctx / size)``),
    in one launch (the fused fold)."""
    n = -(-ctx // size) if n is None else n
    return lambda: ops.split_kv_decode(q, kc, vc, tables, lens, size, max_splits=n, fused=True)


def forced(kc, vc, tables, q, lens, ctx: int, n: int):
    """``split_kv_decode`` with ``n`` splits of ``ctx / n`` keys a sequence, in one launch (the fused fold)."""
    return sized(kc, vc, tables, q, lens, ctx, -(-ctx // n), n)


SMEM64 = "TK_DIAG_SMEM64"  # a diagnostic build's switch with a host side: 64 KB of shared memory a CTA at D = 128
SLOWEST = "TK_SPLIT_SLOWEST"  # a lab switch with a host side: the decode grid's split index is z, the sequence x
_smem_bytes, _carveout, _launch = ops.decode_smem_bytes, ops._carveout_percent, ops._launch


def _launch_split_slowest(ref, module, name, grid, *args, **kw):
    if name.startswith("split_kv_partials"):
        grid = (grid[2], grid[1], grid[0])
    return _launch(ref, module, name, grid, *args, **kw)


_macros: dict[object, tuple[str, ...]] = {}  # a build -> its switches


def smem64_carveout(dev: int, fn, smem: int, ctas: int) -> int:
    """The largest preference (percent) whose configuration still holds ``ctas`` CTAs: the smallest of the
    H100/H200 shared-memory configurations at or above the need, rounded down (the engine rounds up, which
    here would take the next configuration and leave less L1)."""
    import cupy

    rt = cupy.cuda.runtime
    per_sm = rt.deviceGetAttribute(81, dev)
    need = ctas * (smem + int(fn.attributes["shared_size_bytes"]) + rt.deviceGetAttribute(111, dev))
    conf = min(c * 1024 for c in (0, 8, 16, 32, 64, 100, 132, 164, 196, 228) if c * 1024 >= need)
    return 100 * conf // per_sm


def use(mod) -> None:
    """Install ``mod`` (``ab_attention.install``) with its host side: the 64 KB build's shared memory and carveout,
    and the launch of a ``TK_SPLIT_SLOWEST`` build (its grid's order)."""
    install(mod)
    macros = _macros.get(id(mod), ())
    small = SMEM64 in macros
    ops.decode_smem_bytes = (lambda d: 4 * 64 * d * 2) if small else _smem_bytes
    ops._carveout_percent = smem64_carveout if small else _carveout
    ops._launch = _launch_split_slowest if SLOWEST in macros else _launch


def layout_name(lay: str, bs: int) -> str:
    return lay if bs == BS else f"{lay}@{bs}"


def probe(
    B: int,
    ctx: int,
    mods: dict,
    layouts: list[str],
    splits: list[int],
    sizes: list[int],
    rounds: int,
    reps: int,
    gen: torch.Generator,
    sms: int,
    block_sizes: tuple[int, ...] = (BS,),
) -> bool:
    k, v, q, lens = dense_problem(B, ctx, gen)  # [B, ctx, n_kv, D], ...
    gbytes = 2 * k.numel() * 2 / 1e9
    problems = {}
    for bs in sorted(set(block_sizes) | {BS}, key=lambda x: x != BS):  # BS's shuffled first: the draws as before
        n = B * (ctx // bs)
        for lay in ["shuffled", *[x for x in layouts if x != "shuffled"]]:
            if lay.startswith("hnd") or not (bs == BS or lay in layouts):
                continue
            problems[layout_name(lay, bs)] = paged_at(k, v, bs, page_order(n, lay, gen, max(1, GROUP * BS // bs),
                                                                              ctx // bs))
    if any(lay.startswith("hnd") for lay in layouts):  # one KV head a sequence: [B * n_kv, ctx, 1, D]
        k1 = k.permute(0, 2, 1, 3).reshape(B * N_KV, ctx, 1, D)
        v1 = v.permute(0, 2, 1, 3).reshape(B * N_KV, ctx, 1, D)
        for bs in sorted(set(block_sizes) | {BS}, key=lambda x: x != BS):
            n = B * N_KV * (ctx // bs)
            for lay in [x for x in layouts if x.startswith("hnd")]:
                order = page_order(n, "inorder" if lay == "hnd-inorder" else "shuffled", gen)
                problems[layout_name(lay, bs)] = paged_at(k1, v1, bs, order)
        del k1, v1
    names = [layout_name(lay, bs) for bs in [BS, *[x for x in block_sizes if x != BS]] for lay in layouts]
    kd, vd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # [B, n_kv, ctx, D]
    del k, v
    cudnn = sdpa_call("cudnn", q[:, :, None], kd, vd, D**-0.5, "none", "enable_gqa")
    q1 = q.view(B, N_KV, -1, D).reshape(B * N_KV, -1, D)  # [B * n_kv, G, D]: the hnd layouts' queries
    lens1 = lens.repeat_interleave(N_KV)

    def hnd(fn):
        return lambda: fn().view(q.shape)

    calls = {}
    for name, mod in mods.items():
        for lay in names:
            one = lay.startswith("hnd")
            fn = ours(*problems[lay], q1 if one else q, lens1 if one else lens, ctx, sms)
            calls[(name, lay)] = (mod, hnd(fn) if one else fn)
    for n in splits:
        calls[(f"base/s{n}", "shuffled")] = (mods["base"], forced(*problems["shuffled"], q, lens, ctx, n))
    for size in [s if s > 0 else ctx + s for s in sizes]:
        for name, mod in mods.items():
            calls[(f"{name}/k{size}", "shuffled")] = (mod, sized(*problems["shuffled"], q, lens, ctx, size))
    ok = True
    use(mods["base"])
    ref = ours(*problems["shuffled"], q, lens, ctx, sms)().clone()
    by_size = {}  # S -> base's output with splits of S keys
    for (name, lay), (mod, fn) in calls.items():
        use(mod)
        out = fn()
        if "/k" in name and not name.startswith("base/"):  # another variant at a split size: base's bits there
            same = torch.equal(out.view(torch.int16), by_size[name.split("/k")[1]].view(torch.int16))
            ok &= same
            print(f"B={B} ctx={ctx} {name} {lay}: bits {'equal' if same else 'DIFFER'} to base at that size", flush=True)
            continue
        if name.startswith("base/k"):
            by_size[name.split("/k")[1]] = out.clone()
        if "/s" in name or "/k" in name:  # another split: other bits
            err = (out.float() - ref.float()).abs().max().item()
            ok &= err <= 1e-2
            print(f"B={B} ctx={ctx} {name} {lay}: max |out - base| {err:.3g}" + ("" if err <= 1e-2 else " DIFFER"))
            continue
        same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
        ok &= same
        print(f"B={B} ctx={ctx} {name} {lay}: bits {'equal' if same else 'DIFFER'} to base shuffled", flush=True)
    dn = cudnn()[:, :, 0].float()
    err = (dn - ref.float()).abs()
    print(f"B={B} ctx={ctx} cudnn vs base: max |diff| {err.max().item():.3g}, mean {err.mean().item():.3g}", flush=True)
    if not rounds:
        return ok
    best = {key: float("inf") for key in [*calls, ("cudnn", "dense")]}
    for _ in range(rounds):
        for key, (mod, fn) in calls.items():
            use(mod)
            best[key] = min(best[key], gpu_seconds(fn, iters=reps) * 1e6)
        best[("cudnn", "dense")] = min(best[("cudnn", "dense")], gpu_seconds(cudnn, iters=reps) * 1e6)
    c = best[("cudnn", "dense")]
    for (name, lay), us in best.items():
        print(
            f"B={B} ctx={ctx} {name:10s} {lay:9s} {us:9.1f} us  {gbytes / (us * 1e-6) / 1e3:6.3f} TB/s read"
            f"  cuDNN/this {c / us:6.3f}",
            flush=True,
        )
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=["32x4096", "32x16384", "128x1024", "128x4096"])
    ap.add_argument("--variants", nargs="*", default=["base"])
    ap.add_argument("--layouts", nargs="*", default=["shuffled", "inorder", "local"])
    ap.add_argument("--splits", type=int, nargs="*", default=[])
    ap.add_argument("--block-sizes", type=int, nargs="*", default=[BS])
    ap.add_argument("--split-sizes", type=int, nargs="*", default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    specs = parse_variants(a.variants)
    src = kernels.source("attention")
    built, mods = {}, {}  # one build per set of macros
    for name, macros in specs.items():
        if macros not in built:
            built[macros] = build(src, macros)
            _macros[id(built[macros])] = macros
        mods[name] = built[macros]
    for name, macros in specs.items():
        print(f"variant {name}: attention.cu built with {' '.join('-D' + m for m in macros) or '(no macros)'}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ok = True
    for shape in a.shapes:
        B, ctx = (int(x) for x in shape.split("x"))
        if any(ctx % bs for bs in a.block_sizes):
            raise SystemExit(f"context {ctx} is not a whole number of pages of {a.block_sizes}")
        ok &= probe(B, ctx, mods, a.layouts, a.splits, a.split_sizes, a.rounds, a.reps, gen, sms, tuple(a.block_sizes))
        torch.cuda.empty_cache()
    print("all variants and layouts bitwise equal" if ok else "OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
