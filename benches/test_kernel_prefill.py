"""Kernel lab: paged continued prefill, chunk x cached-prefix sweep.

``nseq`` sequences each prefill a chunk of ``C`` new queries at absolute positions
``P .. P+C-1`` over ``P`` cached keys plus the chunk's own (causal by absolute position: a
fresh prompt when ``P = 0``, a resume otherwise), in shuffled pages (``ops.paged_prefill``).
Peers: torch SDPA's flash and cuDNN backends on the same causal problem with a dense bf16
cache (contiguous ``[nseq, heads, tokens, D]``; ``is_causal=True`` when ``P = 0``; lower-right
causal otherwise: flash through ``aten._scaled_dot_product_flash_attention(is_causal=True)``,
whose mask is bottom-right aligned, cuDNN through a boolean mask; GQA through ``enable_gqa=True``
or flash's own head broadcast, falling back to ``repeat_interleave``; the mode used is recorded).

Floor: the causal FLOPs (4·D·n_q per visible query-key pair) over the measured bf16 GEMM rate.
Every implementation is checked against the float32 reference (flash-attention rule) before timing.
"""

from __future__ import annotations

import pytest
import torch

import _ours
from _attn import attention_math, gqa_modes, high_dtype, paged_problem, sdpa_call, tflops
from _bench import Scale, flash_rule, rotation_sets, scale_name, time_fn

GROUP = "kernel_prefill"

# ---------------------------------------------------------------- problem sizes (one table)
SHAPE = {"cpu": dict(n_q=4, n_kv=2, D=32, block=8), "gpu": dict(n_q=32, n_kv=8, D=128, block=16)}  # qwen3-8b attention
CHUNKS = {"cpu": (8, 24), "gpu": (256, 1024, 4096)}
PREFIXES = {"cpu": (0, 40), "gpu": (0, 1024, 4096, 16384)}
QUERY_TOKENS = {"cpu": 32, "gpu": 8192}          # nseq = max(1, QUERY_TOKENS // chunk) sequences per problem
IMPLS = {"cpu": ("reference", "sdpa math"),
         "gpu": ("turnkv", "turnkv x2", "turnkv 64-row", "sdpa flash", "sdpa cudnn")}
# "turnkv": the engine's choice (ops.prefill_variant with the runner's mean keys per row: the warp-specialised
# wgmma kernel on big grids of an sm_90a build, else the two-tiles-per-warp kernel); "turnkv x2": the
# two-tiles-per-warp mma.sync kernel forced (the choice before the twenty-fourth session); "turnkv 64-row": the
# one-tile-per-warp kernel forced (variant "default")
PEER = {"cpu": "sdpa math", "gpu": "sdpa flash"}  # the target's peer

_times: dict[tuple, float] = {}


def pytest_generate_tests(metafunc):
    if "impl" in metafunc.fixturenames:
        s = scale_name(metafunc.config)
        metafunc.parametrize("C,P,impl", [pytest.param(C, P, impl, id=f"C{C}-P{P}-{impl.replace(' ', '_')}")
                                          for C in CHUNKS[s] for P in PREFIXES[s] for impl in IMPLS[s]])


@pytest.fixture(scope="module", autouse=True)
def _describe(results):
    results.describe(GROUP, "Kernel lab: paged continued prefill", columns=[
        ("chunk", "chunk", ""), ("prefix", "cached prefix", ""), ("nseq", "sequences", ""), ("impl", "implementation", ""),
        ("gqa", "GQA / mask", ""), ("median_ms", "median ms", ".4g"), ("p10_ms", "p10 ms", ".4g"),
        ("p90_ms", "p90 ms", ".4g"), ("TFLOPs", "TFLOP/s", ".1f"), ("pct_gemm", "% of GEMM", ".1f"),
        ("floor_ms", "floor ms", ".4g"), ("err_max", "max err", ".2e"), ("rel_err", "rel err", ".2e")],
        plots=[dict(x="prefix", y="TFLOPs", series="impl", facet="chunk", ylabel="TFLOP/s", title="paged prefill")])


def test_prefill(benchmark, scale: Scale, ceilings, results, C, P, impl):
    sh = SHAPE[scale.name]
    nq, nkv, D, bs = sh["n_q"], sh["n_kv"], sh["D"], sh["block"]
    nseq = max(1, QUERY_TOKENS[scale.name] // C)
    L = P + C
    dev = scale.device
    dt = torch.bfloat16 if scale.gpu else torch.float32
    sm = D ** -0.5
    gen = torch.Generator(device=dev).manual_seed(7 * C + P)
    elem = 2 if scale.gpu else 4
    sets = rotation_sets(2 * nseq * L * nkv * D * elem + 2 * nseq * C * nq * D * elem, cap=8)
    probs = [paged_problem(nseq, L, nkv, D, bs, dt, dev, gen) for _ in range(sets)]
    qs = [torch.randn(nseq * C, nq, D, device=dev, generator=gen).to(dt) for _ in range(sets)]
    pos1 = torch.arange(P, L, device=dev, dtype=torch.int32)                         # [C] one sequence's positions
    q_pos = pos1.repeat(nseq)                                                        # [T]
    q_idx = torch.arange(nseq, device=dev, dtype=torch.int32).repeat_interleave(C)   # [T]

    kd, vd = probs[0].dense()
    q0 = qs[0].view(nseq, C, nq, D)
    ref = attention_math(q0, kd, vd, pos1, sm, high_dtype(scale), lowp=False).reshape(nseq * C, nq, D)
    low = attention_math(q0, kd, vd, pos1, sm, high_dtype(scale), lowp=True).reshape(nseq * C, nq, D)
    del kd, vd
    mean_keys = P + (C + 1) / 2        # keys a query row sees, on average (what the engine's runner passes)
    if impl in ("turnkv", "turnkv x2", "turnkv 64-row", "reference"):
        variant = {"turnkv 64-row": "default", "turnkv x2": "x2"}.get(impl)
        fns = [_ours.prefill(scale, qs[i], p.k_cache, p.v_cache, p.tables, p.lens, q_idx, q_pos, sm, variant,
                             mean_keys) for i, p in enumerate(probs)]
        check = flash_rule(fns[0]().float(), ref, low, f"{impl} C={C} P={P}")
        gqa = "native (paged)"
        if scale.gpu:  # the kernel it ran
            from optimized import ops
            index = torch.device(dev).index or 0
            chosen = variant or ops.prefill_variant(
                nseq * C, nq, nkv, D, torch.cuda.get_device_properties(dev).multi_processor_count,
                ws="ws" in ops.prefill_variants(D, index), mean_keys=mean_keys)
            gqa += f", {chosen}"
    else:
        backend = impl.split()[1]
        dense = [tuple(x.transpose(1, 2).contiguous() for x in p.dense()) for p in probs]   # [nseq, n_kv, L, D]
        qd = [q.view(nseq, C, nq, D).transpose(1, 2).contiguous() for q in qs]                 # [nseq, n_q, C, D]
        del probs
        causal = "square" if P == 0 else "lower_right"
        fns, errors = None, []
        for mode in gqa_modes(nq, nkv, 2 * nseq * L * nq * D * 2 * sets):
            try:
                cand = [sdpa_call(backend if scale.gpu else "math", qd[i], k, v, sm, causal, mode)
                        for i, (k, v) in enumerate(dense)]
                out = cand[0]().transpose(1, 2).reshape(nseq * C, nq, D)
                check = flash_rule(out.float(), ref, low, f"{impl} ({mode}, {causal}) C={C} P={P}")
                fns, gqa = cand, f"{mode}, {causal}"
                break
            except (RuntimeError, NotImplementedError, AssertionError, TypeError, ValueError) as e:
                errors.append(f"{mode}: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
        if fns is None:
            results.note(GROUP, f"{impl} C={C} P={P} not run: {'; '.join(errors)}")
            pytest.skip(f"{impl} cannot run this problem: {'; '.join(errors)}")

    t = time_fn(benchmark, lambda i: fns[i](), scale, sets=len(fns))
    flops = 4.0 * D * nq * nseq * (C * P + C * (C + 1) / 2)
    tf = tflops(flops, t.median_ms)
    _times[(C, P, impl)] = t.median_ms
    results.add(GROUP, chunk=C, prefix=P, nseq=nseq, impl=impl, gqa=gqa, **t.as_dict(), TFLOPs=tf,
                pct_gemm=100 * tf / ceilings["gemm_TFLOPs"], floor_ms=flops / (ceilings["gemm_TFLOPs"] * 1e12) * 1e3,
                flops=flops, sets=t.sets, **check)
    benchmark.extra_info.update({"TFLOPs": tf, "median_ms": t.median_ms, "gqa": gqa})


def test_prefill_targets(scale: Scale, results):
    """Target of issue 5 (reported): paged prefill >= 1.0x SDPA's flash backend on the same causal problem."""
    ours = "turnkv" if scale.gpu else "reference"
    peer = PEER[scale.name]
    ratios = [(_times[(C, P, peer)] / _times[(C, P, ours)], C, P) for (C, P, i) in list(_times)
              if i == ours and (C, P, peer) in _times]
    if not ratios:
        results.target(GROUP, f"paged prefill: speed vs {peer}", None, 1.0, unit="x", detail="no pair of results")
        pytest.skip("no prefill results to summarise")
    r, C, P = min(ratios)
    results.target(GROUP, f"paged prefill: speed vs {peer} (worst case)", r, 1.0, unit="x",
                   detail=f"worst at chunk {C}, prefix {P}; best {max(ratios)[0]:.2f}x; "
                          f"geomean {torch.tensor([x[0] for x in ratios]).log().mean().exp():.2f}x")
