#!/usr/bin/env python
"""A/B of the attention kernels against another version of ``attention.cu``, in one process.

    git show REV:optimized/kernels/attention.cu > base_attention.cu
    python benches/gpu/ab_attention.py --base base_attention.cu [--new other.cu] [--rounds 3] [--reps 20]

``--new`` (default: the working tree's ``attention.cu``) lets two files other than the tree's meet.
``--base-define NAME ...`` compiles the base with ``-DNAME`` (a compile-time switch of the tree's own
file: ``--base optimized/kernels/attention.cu --base-define TK_CP_ASYNC_CG``).
First it prints, per side, the registers and local memory (spills) that this machine's compiler gave
each prefill and split-KV kernel. For each lab problem (qwen3-8b attention: 32 query heads, 8 KV heads, head_dim 128, pages of 16 in
shuffled order, NaN in every slot no sequence owns), it runs the working tree's kernels ("new") and
the base file's ("base") through the same ``optimized.ops`` entry points, and

* checks that the two give the same bits (a change that only moves work around -- how the K/V
  copies are addressed, which code path a tile takes -- must not change a single output bit);
* times both, alternated over ``--rounds`` rounds (``check_kernels``' timer: ``--reps`` calls in one
  CUDA graph after a warm-up), and prints each side's best round and the ratio.

Paged prefill: (sequences x chunk over cached prefix) as in ``probe_kernels.py``, each prefill variant (or those
``--variants`` names).
Split-KV decode: (batch, context) at the engine's ``auto`` split, with ``fused`` as the engine picks it
(``--decode-shapes 256x288 ...`` in place of the lab's list).
Exits non-zero when any output differs, unless ``--bits-may-differ`` (a change of the arithmetic: each
side's accuracy is then ``check_kernels.py``'s to show) makes it print the largest difference instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import torch  # noqa: E402

from _attn import paged_problem  # noqa: E402
from check_kernels import _time as gpu_seconds  # noqa: E402
from optimized import kernels, ops  # noqa: E402
from reference.attention import split_size_for  # noqa: E402

N_Q, N_KV, D, BS = 32, 8, 128, 16
PREFILL = [(8, 1024, 4096), (32, 256, 0), (2, 4096, 0), (32, 256, 16384), (8, 1024, 16384), (2, 4096, 16384),
           (8, 1024, 0), (32, 256, 1024), (8, 1024, 1024)]
DECODE = [(1, 300), (1, 4096), (1, 16384), (8, 300), (8, 4096), (8, 16384), (32, 1024), (32, 4096), (64, 2048),
          (128, 16384), (1, 1024), (8, 1024), (32, 16384), (128, 1024), (128, 4096)]


def build(text: str, defines: tuple[str, ...] | list[str] = (), name: str = "attention"):
    """A kernel source ``text`` compiled as the engine compiles ``<name>.cu`` (its architecture-specific target),
    plus ``-DNAME`` for each of ``defines`` (the device scripts' compile-time switches). Its local headers are
    today's, so a header change shows up on both sides of an A/B."""
    import cupy

    opts = tuple(kernels.OPTIONS) + tuple(f"-D{d}" for d in defines)
    mod = cupy.RawModule(code=kernels.with_headers(text), options=opts)
    cc = cupy.cuda.Device().compute_capability
    target = kernels.arch_target(name, (int(cc[:-1]), int(cc[-1])))   # as kernels.load builds it
    if target is not None:
        with kernels._nvrtc_target(target):
            mod.compile()
    else:
        mod.compile()
    return mod


def install(mod, module: str = "attention") -> None:
    """Make ``mod`` the ``module`` kernels ``optimized.ops`` launches (on the current device)."""
    import cupy

    kernels._modules[(module, cupy.cuda.Device().id)] = mod
    for key in [k for k in ops._functions if k[1] == module]:
        del ops._functions[key]
    for key in [k for k in ops._function_smem if k[1] == module]:  # the new module's kernels are not opted in yet
        del ops._function_smem[key]


def compare(name: str, sides: dict, call, rounds: int, reps: int, work: float, unit: str,
            bits_may_differ: bool = False) -> bool:
    outs = {}
    for tag, mod in sides.items():
        install(mod)
        outs[tag] = call().clone()
        torch.cuda.synchronize()
    same = torch.equal(outs["new"].view(torch.int16), outs["base"].view(torch.int16))
    diff = (outs["new"].float() - outs["base"].float()).abs()
    bits = "equal" if same else f"DIFFER (max |new - base| {diff.max().item():.3g}, mean {diff.mean().item():.3g})"
    best = {tag: float("inf") for tag in sides}
    for _ in range(rounds):
        for tag, mod in sides.items():
            install(mod)
            best[tag] = min(best[tag], gpu_seconds(call, iters=reps) * 1e6)
    rate = {tag: work / (us * 1e-6) for tag, us in best.items()}
    print(f"{name}: base {best['base']:.1f} us ({rate['base']:.1f} {unit}), new {best['new']:.1f} us "
          f"({rate['new']:.1f} {unit}), new/base time {best['new'] / best['base']:.3f}, bits {bits}", flush=True)
    return same or bits_may_differ


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the attention.cu to compare against")
    ap.add_argument("--new", type=Path, default=None, help="the attention.cu under test (default: the tree's)")
    ap.add_argument("--base-define", nargs="*", default=[], help="macros (-DNAME) the base is compiled with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", nargs="*", choices=("prefill", "decode"), default=("prefill", "decode"))
    ap.add_argument("--bits-may-differ", action="store_true",
                    help="report differing outputs (their largest difference) without failing")
    ap.add_argument("--problems", nargs="*", type=int, default=None,
                    help="indices into the section's problem list (default: all)")
    ap.add_argument("--decode-shapes", nargs="*", default=None, metavar="BxCTX",
                    help="decode problems (batch x context) in place of the lab's list, e.g. 256x288")
    ap.add_argument("--variants", nargs="*", default=None,
                    help="the prefill variants to compare (default: every one the device has)")
    a = ap.parse_args()
    if a.decode_shapes is not None:
        DECODE[:] = [tuple(int(x) for x in shape.split("x")) for shape in a.decode_shapes]
    if a.problems is not None:
        PREFILL[:] = [PREFILL[i] for i in a.problems if i < len(PREFILL)]
        DECODE[:] = [DECODE[i] for i in a.problems if i < len(DECODE)]
    kernels.load("attention")
    import cupy

    dev = cupy.cuda.Device().id
    new = kernels._modules[("attention", dev)] if a.new is None else build(a.new.read_text())
    sides = {"base": build(a.base.read_text(), a.base_define), "new": new}
    for tag, mod in sides.items():
        cells = []
        for name in kernels.SOURCES["attention"]:
            if name.startswith(("paged_prefill", "split_kv_partials")):
                at = mod.get_function(name).attributes
                cells.append(f"{name} {at['num_regs']} regs / {at['local_size_bytes']} B local")
        what = f"{a.base} {' '.join('-D' + d for d in a.base_define)}".strip() if tag == "base" else a.new or "tree"
        print(f"{tag} ({what}): " + ", ".join(cells), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if "prefill" in a.only:
        for nseq, C, P in PREFILL:
            p = paged_problem(nseq, P + C, N_KV, D, BS, torch.bfloat16, "cuda", gen)
            q = torch.randn(nseq * C, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)
            pos = torch.arange(P, P + C, device="cuda", dtype=torch.int32).repeat(nseq)
            idx = torch.arange(nseq, device="cuda", dtype=torch.int32).repeat_interleave(C)
            tflop = 4.0 * D * N_Q * nseq * (C * P + C * (C + 1) / 2) / 1e12
            for v in a.variants or ops.prefill_variants(D, 0):
                ok &= compare(f"paged_prefill[{v}] {nseq}x{C} over {P}", sides,
                              lambda v=v, p=p, q=q, idx=idx, pos=pos: ops.paged_prefill(
                                  q, p.k_cache, p.v_cache, p.tables, p.lens, idx, pos, variant=v),
                              a.rounds, a.reps, tflop, "TFLOP/s", a.bits_may_differ)
            del p
    if "decode" in a.only:
        for B, ctx in DECODE:
            p = paged_problem(B, ctx, N_KV, D, BS, torch.bfloat16, "cuda", gen)
            q = torch.randn(B, N_Q, D, device="cuda", generator=gen).to(torch.bfloat16)
            size = split_size_for("auto", 0, [ctx] * B, N_KV, sms)
            n = 1 if size is None else -(-ctx // size)
            gbytes = 2 * B * ctx * N_KV * D * 2 / 1e9
            ok &= compare(f"split_kv_decode B={B} ctx={ctx} auto ({n} x {size or ctx})", sides,
                          lambda p=p, q=q, size=size, n=n: ops.split_kv_decode(
                              q, p.k_cache, p.v_cache, p.tables, p.lens, size, max_splits=n),
                          a.rounds, a.reps, gbytes, "GB/s", a.bits_may_differ)
            del p
    print("all outputs bitwise equal to the base" if ok and not a.bits_may_differ else
          "outputs compared (--bits-may-differ)" if ok else "SOME OUTPUTS DIFFER FROM THE BASE")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
