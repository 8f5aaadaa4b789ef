"""Whether cuBLAS's GEMM kernels wait on a programmatic grid dependency, and whether the engine's outputs stay
the same with them behind programmatic edges (``CudaRunner.blas_pdl``, ``optimized/graph_edges.py``).

Run on the GPU from the repository root: ``python benches/gpu/probe_blas_pdl.py [--out DIR]``.

* ``wait``: for each decode GEMM of the models (qkv, o_proj, gate/up, down, LM head; called as the runner calls
  cuBLAS) at each row count, a CUDA graph of two kernels: ``spin_then_copy`` (``pdl_probe.cu``: lets its
  dependents launch at once, then 200 us later writes the GEMM's input) and the GEMM. Replayed three ways:
  - ``full``: the edge as captured, a full dependency -- the GEMM must see the new input;
  - ``pdl``: the edges into kernels matching ``--pattern`` rewritten as programmatic. A GEMM kernel that waits
    on the grid dependency sees the new input ("waits"); one that does not, the old ("NO WAIT"); a case whose
    graph has no kernel-to-kernel edge into the GEMM to rewrite is "untested" (its captured edges are printed);
  - ``control``: the same rewrite in front of a torch elementwise kernel, which does not wait: it must see
    the old input, or the probe cannot tell the two apart ("no power").
  Each result is compared bit for bit with the same call run eagerly on the old and on the new input.
* ``engine``: greedy rollouts (logprobs on) of the optimized engine with ``blas_pdl`` off and on, at each batch;
  token ids and logprob bits must be equal. Prints the edges the capture rewrote.

Exit code 1 when any verdict is not "waits", a control lacks power, or the engine's outputs differ.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import optimized  # noqa: E402
from optimized import graph_edges, launch  # noqa: E402
from optimized.runner import BLAS_PDL_KERNELS  # noqa: E402
from conformance.cases import draw_weights  # noqa: E402
from reference import SamplingParams  # noqa: E402
from reference.config import named_config  # noqa: E402
from probe_blas import model_gemms  # noqa: E402

SPIN_NS = 200_000


def shapes(name: str) -> dict[str, tuple[int, int]]:
    """role -> (N, K) of the decode GEMMs of a model (``probe_blas.model_gemms``)."""
    return {role: (N, K) for role, N, K, _ in model_gemms(name)}


def cublaslt_version() -> int | None:
    """``cublasLtGetVersion()`` of the cuBLASLt library already loaded in this process (torch's, after its first
    GEMM), or None when none is."""
    for soname in ("libcublasLt.so.13", "libcublasLt.so.12"):
        try:
            lib = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        return int(lib.cublasLtGetVersion())
    return None


def gemm(role: str):
    """The call the runner makes on cuBLAS for this role (``CudaRunner._mm`` / ``logits``)."""
    if role == "lm_head":
        return lambda x, w: torch.mm(x, w.t(), out_dtype=torch.float32)
    return lambda x, w: torch.matmul(x, w.t())


class Spin:
    """``spin_then_copy`` of pdl_probe.cu, launched with programmatic stream serialization."""

    def __init__(self) -> None:
        import cupy
        src = (Path(__file__).with_name("pdl_probe.cu")).read_text()
        self.fn = cupy.RawModule(code=src, options=("-std=c++17",)).get_function("spin_then_copy")

    def __call__(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        args = (np.uint64(src.data_ptr()), np.uint64(dst.data_ptr()), np.int32(dst.numel()), np.uint64(SPIN_NS))
        launch.launch_pdl(self.fn.kernel.ptr, (8,), (256,), args, 0, torch.cuda.current_stream().cuda_stream)


def replay_case(spin: Spin, fn, x_old: torch.Tensor, x_new: torch.Tensor, w: torch.Tensor, pattern: str | None
                ) -> tuple[torch.Tensor, list[tuple[str, str]], list[str], list[tuple[str, str, tuple]]]:
    """One graph [spin_then_copy -> fn(x, w)], edges into kernels matching ``pattern`` rewritten (None: none);
    returns fn's output after a replay from x = x_old, the edges rewritten, the graph's kernel names and every
    kernel-to-kernel edge (names, (from_port, to_port, type)) as captured."""
    x = x_old.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                    # warm-up: cuBLAS's heuristics and workspace outside the capture
        fn(x, w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        spin(x_new, x)
        y = fn(x, w)
    raw = g.raw_cuda_graph()
    names = graph_edges.kernel_names(raw)
    captured = [(names.get(e.src, "(not a kernel)"), names.get(e.dst, "(not a kernel)"), (e.from_port, e.to_port, e.type))
                for e in graph_edges.graph_edges(raw)]
    done = graph_edges.make_programmatic(raw, pattern) if pattern else []
    g.instantiate()
    x.copy_(x_old)
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    out = y.clone()
    del g
    return out, done, sorted(set(names.values())), captured


def verdict(y: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> str:
    if torch.equal(y, new):
        return "new"
    if torch.equal(y, old):
        return "old"
    return f"neither (max |y - new| {(y.float() - new.float()).abs().max().item():.3g})"


def probe_wait(models: list[str], rows: list[int], pattern: str, log: list[str]) -> tuple[bool, dict]:
    spin = Spin()
    ok = True
    kernels: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    cases = []
    shown = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    for model in models:
        for role, (N, K) in shapes(model).items():
            w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
            fn = gemm(role)
            for M in rows:
                x_old = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
                x_new = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
                old, new = fn(x_old, w), fn(x_new, w)
                y_full, _, names, captured = replay_case(spin, fn, x_old, x_new, w, None)
                y_pdl, done, _, _ = replay_case(spin, fn, x_old, x_new, w, pattern)
                y_ctl, ctl_done, _, _ = replay_case(spin, lambda a, b: a * 1, x_old, x_new, w, "elementwise")
                v_full, v_pdl = verdict(y_full, old, new), verdict(y_pdl, old, new)
                v_ctl = verdict(y_ctl, x_old, x_new)
                blas = [n for n in names if n != "spin_then_copy"]
                res = ("untested" if not done else "waits" if v_pdl == "new" else "NO WAIT" if v_pdl == "old"
                       else "MIXED")
                power = v_ctl == "old" and bool(ctl_done)
                if v_full != "new" or res != "waits" or not power or not done:
                    ok = False
                for b in blas:
                    kernels[b][res if power else "no power"] += 1
                line = (f"{model:>10} {role:>8} M={M:<4} full:{v_full:<4} pdl:{v_pdl:<4} -> {res:<7} "
                        f"control:{v_ctl:<4}{'' if power else ' (NO POWER)'} rewritten {len(done)}: "
                        f"{', '.join(b[:60] for b in blas)}")
                print(line, flush=True)
                log.append(line)
                cases.append(dict(model=model, role=role, M=M, full=v_full, pdl=v_pdl, control=v_ctl, verdict=res,
                                  power=power, rewritten=done, kernels=blas))
                if not shown or not done:          # the captured graph's edges: the first case, and any untested
                    print(f"   captured edges (from, to, (from_port, to_port, type)): {captured}", flush=True)
                    shown = True
            del w
    print("\nper cuBLAS kernel: verdicts over the cases that launched it")
    for name, cnt in sorted(kernels.items()):
        line = f"  {dict(cnt)}  {name}"
        print(line)
        log.append(line)
    return ok, {"cases": cases, "kernels": {k: dict(v) for k, v in kernels.items()}}


def probe_engine(models: list[str], batches: list[int], steps: int) -> tuple[bool, list[dict]]:
    ok = True
    out = []
    for model in models:
        cfg = named_config(model)
        w = draw_weights(cfg, 0, torch.device("cuda"))
        need = max(batches) * (-(-(256 + steps + 16) // 16)) + 8
        eng = optimized.Engine.from_state_dict(cfg, w, device="cuda:0", block_size=16, max_num_seqs=max(batches),
                                               max_model_len=1024, num_blocks=need)
        del w
        sp = SamplingParams(temperature=0.0, max_tokens=steps, stop_token_ids=(), logprobs=True)
        for batch in batches:
            prompts = [[(b * 131 + i * 7) % cfg.vocab_size for i in range(256)] for b in range(batch)]
            res = {}
            for on in (False, True):
                eng.runner.blas_pdl = on
                eng.runner.graphs, eng.runner.pool = {}, None
                before = eng.runner.blas_pdl_edges
                sids = [eng.rollout_add(p, sp) for p in prompts]
                outs = eng.rollout_run_turns()
                toks = [outs[s].token_ids for s in sids]
                bits = [[struct.unpack("<I", struct.pack("<f", v))[0] for v in outs[s].logprobs] for s in sids]
                for s in sids:
                    eng.rollout_finish(s)
                res[on] = (toks, bits, eng.runner.blas_pdl_edges - before)
            same = res[False][0] == res[True][0] and res[False][1] == res[True][1]
            ok &= same and res[True][2] > 0
            print(f"engine {model} batch {batch}: tokens and logprob bits {'equal' if same else 'DIFFER'} with blas_pdl "
                  f"(edges rewritten in its captures: {res[True][2]})", flush=True)
            out.append(dict(model=model, batch=batch, equal=same, edges=res[True][2]))
        eng.runner.blas_pdl = False
        eng.runner.graphs.clear()
        del eng
        torch.cuda.empty_cache()
    return ok, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=("wait", "engine"), default=["wait", "engine"])
    ap.add_argument("--models", nargs="*", default=["qwen3-0.6b", "qwen3-8b"])
    ap.add_argument("--rows", nargs="*", type=int, default=[16, 32, 48, 64, 96, 128, 192, 256])
    ap.add_argument("--batches", nargs="*", type=int, default=[32, 64])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--pattern", default=BLAS_PDL_KERNELS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.ones(8, 8, device="cuda", dtype=torch.bfloat16) @ torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLASLt "
          f"{cublaslt_version()}, pattern {args.pattern!r}", flush=True)
    ok, report, log = True, {}, []
    if "wait" in args.only:
        w_ok, report["wait"] = probe_wait(args.models, args.rows, args.pattern, log)
        ok &= w_ok
    if "engine" in args.only:
        e_ok, report["engine"] = probe_engine(args.models, args.batches, args.steps)
        ok &= e_ok
    print("verdict:", "every GEMM kernel waits, the engine's outputs are the same" if ok else "FAILED (see above)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_blas_pdl.json").write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
