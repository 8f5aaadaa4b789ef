"""Kernel lab: the batch-invariant GEMM (``ops.gemm``) against ``torch.matmul`` (cuBLAS) on the
GEMMs of a qwen3-8b step.

``y [M, N] = x [M, K] @ w [N, K].T``, bf16 inputs, fp32 accumulation; the weights of the fused qkv
projection, o_proj, the fused gate_up projection, down_proj and the LM head (shapes taken from the
model config), ``M`` the tokens of the step: decode batches (1 .. 64) and prefill chunks (256, 2048).
Outputs are bf16, except the LM head's, which is fp32 (the logits; the default engine asks
``torch.mm(..., out_dtype=torch.float32)`` for it where torch allows, and the peer does the same).

Checked before timing, both implementations:

* accuracy, by the flash-attention rule: error against the fp32 torch product (float64 on the CPU
  scale) at most twice the error of torch's bf16 ``matmul`` plus one bf16 rounding step of the
  magnitude (max and mean; at most ``CHECK_ROWS`` rows, evenly spaced, of the large problems);
* batch invariance: for a few rows ``r`` (first, middle, last), the product of the one-row input
  ``x[r:r+1]`` equals row ``r`` of the ``M``-row product bitwise. Asserted for ``ops.gemm``; only
  recorded (``rows bitwise``) for cuBLAS, which picks its tiling (and split-K) from ``M``.

Timed with CUDA events after warm-up, inputs and weights rotated beyond the L2. Reported: TFLOP/s
(2·M·N·K over time), GB/s (weight bytes over time: the decode GEMMs are weight reads), the speed
ratio to ``torch.matmul``, and the GEMM time of a whole decode step (every layer's four GEMMs plus
the LM head) with each implementation, whose difference is the part of the batch-invariant engine's
decode overhead that the GEMMs cause (goal of the engine: at most 10%).

At M <= 16 on the GPU a third implementation runs: ``ops.skinny_gemm``, the register-streaming kernel
for the rows of a small decode step, and at M <= 8 a fourth: ``ops.skinny_staged``, the default (not
batch-invariant) engine's GEMM for those rows (its row of M rows equals the row alone, bitwise:
asserted), against the same cuBLAS rows; the step notes then compare the decode GEMMs of a step on
each.

CPU scale: the reference's row-at-a-time ``linear(x, w, batch_invariant=True)`` against
``torch.matmul`` in fp32 at the tiny model's shapes (a smoke test of the harness).
"""

from __future__ import annotations

import zlib

import pytest
import torch

import _ours
from _bench import Scale, flash_rule, rotation_sets, scale_name, time_fn
from reference import named_config

GROUP = "kernel_gemm"

# ---------------------------------------------------------------- problem sizes (one table)
MODEL = {"cpu": "tiny", "gpu": "qwen3-8b"}
M_SIZES = {"cpu": (1, 4, 16), "gpu": (1, 8, 16, 32, 64, 256, 2048)}
DECODE_MAX_M = {"cpu": 4, "gpu": 64}            # M up to this is a decode batch (the overhead target)
GEMMS = ("qkv", "o_proj", "gate_up", "down", "lm_head")
OURS = {"cpu": "reference", "gpu": "turnkv"}
PEER = "torch.matmul"
SKINNY = "turnkv skinny"                        # ops.skinny_gemm (default mode, M <= SKINNY_MAX_M; GPU only)
SKINNY_MAX_M = 16
STAGED = "turnkv staged"                        # ops.skinny_staged (the default engine's, M <= 8; GPU only)
STAGED_MAX_M = 8
BUDGET_S = {"cpu": 0.02, "gpu": 0.25}           # timing budget per case
CHECK_ROWS = 256                                # rows checked by the accuracy rule
GOAL_OVERHEAD_PCT = 10.0

_times: dict[tuple, float] = {}                 # (gemm, M, impl) -> median ms


def gemm_shapes(name: str) -> dict[str, tuple[int, int, torch.dtype]]:
    """``gemm -> (N, K, out dtype)`` of one layer (and the head) of model ``name``."""
    c = named_config(name)
    H, I, D = c.hidden_size, c.intermediate_size, c.head_dim
    return {"qkv": ((c.num_attention_heads + 2 * c.num_key_value_heads) * D, H, torch.bfloat16),
            "o_proj": (H, c.num_attention_heads * D, torch.bfloat16),
            "gate_up": (2 * I, H, torch.bfloat16),
            "down": (H, I, torch.bfloat16),
            "lm_head": (c.vocab_size, H, torch.float32)}


def pytest_generate_tests(metafunc):
    if "impl" in metafunc.fixturenames and "gemm" in metafunc.fixturenames:
        s = scale_name(metafunc.config)
        metafunc.parametrize("gemm,M,impl", [pytest.param(g, M, i, id=f"{g}-M{M}-{i.replace('.', '_').replace(' ', '_')}")
                                             for g in GEMMS for M in M_SIZES[s] for i in _impls(s, M)])


def _impls(s: str, M: int) -> tuple[str, ...]:
    return (PEER, OURS[s]) + ((SKINNY,) if s == "gpu" and M <= SKINNY_MAX_M else ()) \
        + ((STAGED,) if s == "gpu" and M <= STAGED_MAX_M else ())


@pytest.fixture(scope="module", autouse=True)
def _describe(results, scale: Scale):
    ours = OURS[scale.name]
    results.describe(GROUP, f"Kernel lab: batch-invariant GEMM vs torch.matmul ({MODEL[scale.name]} shapes)", columns=[
        ("gemm", "GEMM", ""), ("shape", "N x K", ""), ("M", "M", ""), ("impl", "implementation", ""),
        ("out_dtype", "out", ""), ("median_ms", "median ms", ".4g"), ("p10_ms", "p10 ms", ".4g"),
        ("p90_ms", "p90 ms", ".4g"), ("TFLOPs", "TFLOP/s", ".1f"), ("GBps", "weight GB/s", ".0f"),
        ("pct_copy", "% of copy", ".1f"), ("pct_gemm", "% of GEMM", ".1f"), ("floor_ms", "floor ms", ".4g"),
        ("x_torch", "x torch.matmul", ".2f"), ("rows_bitwise", "rows bitwise", ""), ("err_max", "max err", ".2e"),
        ("ref_lowp_err_max", "bf16 matmul err", ".2e"), ("sets", "rotated sets", "")],
        plots=[dict(x="M", y="x_torch", series="gemm", where={"impl": ours}, logx=True, ylabel="speed vs torch.matmul (x)",
                    title=f"{ours} GEMM / torch.matmul", hlines=[(1.0, "parity"), (0.9, "-10%")]),
               dict(x="M", y="TFLOPs", series="impl", facet="gemm", logx=True, logy=True, ylabel="TFLOP/s",
                    title="GEMM")])


def _peer(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, out: torch.Tensor | None):
    """Closure: cuBLAS as the default engine calls it (bf16 output into ``out``; fp32 output of the
    GEMM itself for the LM head where torch has ``out_dtype``, else a bf16 product cast up)."""
    if out_dtype == x.dtype:
        return lambda: torch.matmul(x, w.t(), out=out)
    try:
        probe = torch.mm(x[:1], w[:8].t(), out_dtype=out_dtype)
        direct = probe.dtype == out_dtype
    except (TypeError, RuntimeError):
        direct = False
    if direct:
        return lambda: torch.mm(x, w.t(), out_dtype=out_dtype)
    return lambda: torch.matmul(x, w.t()).to(out_dtype)


def _make(impl: str, scale: Scale, x, w, out_dtype, out=None):
    if impl == PEER:
        return _peer(x, w, out_dtype, out)
    if impl == SKINNY:
        return _ours.skinny_gemm(x, w, out_dtype, out=out)
    if impl == STAGED:
        return _ours.skinny_staged(x, w, out_dtype, out=out)
    return _ours.gemm(scale, x, w, out_dtype, out=out)


def _set_ratio(results, gemm: str, M: int) -> None:
    for r in results.group(GROUP).records:
        if r["gemm"] == gemm and r["M"] == M and r["impl"] != PEER and (gemm, M, PEER) in _times:
            r["x_torch"] = _times[(gemm, M, PEER)] / _times[(gemm, M, r["impl"])]


def test_gemm(benchmark, scale: Scale, ceilings, results, gemm: str, M: int, impl: str):
    s = scale.name
    N, K, out_dtype = gemm_shapes(MODEL[s])[gemm]
    dev = scale.device
    dt = torch.bfloat16 if scale.gpu else torch.float32
    out_dtype = out_dtype if scale.gpu else torch.float32
    high = torch.float32 if scale.gpu else torch.float64
    el, out_el = dt.itemsize, out_dtype.itemsize
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{gemm}/{M}".encode()))
    w_bytes = N * K * el
    moved = w_bytes + M * K * el + M * N * out_el
    sets = rotation_sets(moved, cap=8)
    ws = [(torch.randn(N, K, device=dev, generator=gen) * K ** -0.5).to(dt) for _ in range(sets)]
    xs = [torch.randn(M, K, device=dev, generator=gen).to(dt) for _ in range(sets)]
    outs = [torch.empty(M, N, device=dev, dtype=out_dtype) for _ in range(sets)]
    fns = [_make(impl, scale, x, w, out_dtype, o) for x, w, o in zip(xs, ws, outs)]

    # ---- accuracy: the flash-attention rule against the fp32 (CPU: float64) product
    x0, w0 = xs[0], ws[0]
    y = fns[0]()
    y = outs[0] if y is None else y
    assert y.shape == (M, N) and y.dtype == out_dtype, f"{impl} {gemm} M={M}: got {tuple(y.shape)} {y.dtype}"
    rows = torch.arange(M, device=dev) if M <= CHECK_ROWS else \
        torch.linspace(0, M - 1, CHECK_ROWS, device=dev).round().long().unique()
    xr = x0[rows]
    ref = xr.to(high) @ w0.to(high).t()
    low = torch.matmul(xr, w0.t())
    check = flash_rule(y[rows].float(), ref, low, f"{impl} {gemm} [{M}, {K}] x [{N}, {K}]^T")
    del ref, low, xr

    # ---- batch invariance: row r of the M-row product == the product of row r alone, bitwise
    bitwise = []
    for r in sorted({0, M // 2, M - 1}):
        one = _make(impl, scale, x0[r:r + 1].contiguous(), w0, out_dtype)()
        bitwise.append((r, bool(torch.equal(one[0], y[r])),
                        float((one[0].double() - y[r].double()).abs().max())))
    same = all(b for _, b, _ in bitwise)
    if impl in (OURS[s], STAGED):
        bad = [f"row {r}: max diff {d:.3g}" for r, b, d in bitwise if not b]
        assert same, f"{impl} {gemm} M={M}: rows are not batch-invariant (one-row product differs): {'; '.join(bad)}"
    del y

    t = time_fn(benchmark, lambda i: fns[i](), scale, sets=len(fns), budget_s=BUDGET_S[s])
    flops = 2.0 * M * N * K
    sec = t.median_ms / 1e3
    bw, rate = ceilings["copy_GBps"] * 1e9, ceilings["gemm_TFLOPs"] * 1e12
    _times[(gemm, M, impl)] = t.median_ms
    results.add(GROUP, gemm=gemm, shape=f"{N} x {K}", N=N, K=K, M=M, impl=impl, out_dtype=str(out_dtype).split(".")[-1],
                **t.as_dict(), TFLOPs=flops / sec / 1e12, GBps=w_bytes / sec / 1e9,
                pct_copy=100 * moved / sec / bw, pct_gemm=100 * flops / sec / rate,
                floor_ms=max(moved / bw, flops / rate) * 1e3, weight_bytes=w_bytes, bytes=moved, flops=flops,
                rows_bitwise=same, sets=t.sets, **check)
    _set_ratio(results, gemm, M)
    benchmark.extra_info.update({"TFLOPs": flops / sec / 1e12, "GBps": w_bytes / sec / 1e9, "median_ms": t.median_ms})


def test_gemm_targets(scale: Scale, results):
    """The GEMM time of one decode step (every layer's qkv, o_proj, gate_up and down, plus the LM head)
    with each implementation; overhead = 1 - torch.matmul time / ours (as the engine's 1 - tok/s ratio)."""
    s = scale.name
    ours = OURS[s]
    layers = named_config(MODEL[s]).num_hidden_layers
    per_m = {}
    for M in M_SIZES[s]:
        if all((g, M, i) in _times for g in GEMMS for i in (PEER, ours)):
            step = {i: layers * sum(_times[(g, M, i)] for g in GEMMS if g != "lm_head") + _times[("lm_head", M, i)]
                    for i in (PEER, ours)}
            per_m[M] = (100 * (1 - step[PEER] / step[ours]), step[PEER], step[ours])
            results.note(GROUP, f"{MODEL[s]} step of M = {M} tokens ({layers} layers + LM head): GEMMs take "
                                f"{step[ours]:.4g} ms with {ours}, {step[PEER]:.4g} ms with {PEER}: overhead "
                                f"{per_m[M][0]:.1f}%")
        for fast in (SKINNY, STAGED):
            if M in per_m and all((g, M, fast) in _times for g in GEMMS):
                sk = layers * sum(_times[(g, M, fast)] for g in GEMMS if g != "lm_head") + _times[("lm_head", M, fast)]
                results.note(GROUP, f"M = {M}: the step's GEMMs take {sk:.4g} ms with {fast} against "
                                    f"{per_m[M][1]:.4g} ms with {PEER} ({per_m[M][1] / sk:.2f}x)")
    recs = results.group(GROUP).records
    varies = [f"{r['gemm']} M={r['M']}" for r in recs if r["impl"] == PEER and not r.get("rows_bitwise", True)]
    if varies:
        results.note(GROUP, f"{PEER}: a row's product changes with M (the one-row product differs bitwise from the "
                            f"same row of the M-row product) at {', '.join(varies)}")
    dec = {M: v for M, v in per_m.items() if M <= DECODE_MAX_M[s]}
    what = f"{MODEL[s]} decode-step GEMM time overhead vs {PEER} (worst over M <= {DECODE_MAX_M[s]})"
    if not dec:
        results.target(GROUP, what, None, GOAL_OVERHEAD_PCT, op="<=", unit="%", detail="no complete set of results")
        pytest.skip("no complete set of GEMM results to summarise")
    M, (ov, tp, to) = max(dec.items(), key=lambda kv: kv[1][0])
    results.target(GROUP, what, ov, GOAL_OVERHEAD_PCT, op="<=", unit="%",
                   detail=f"worst at M = {M}: {to:.4g} vs {tp:.4g} ms; "
                          + ", ".join(f"M={m}: {v[0]:.1f}%" for m, v in per_m.items()))
