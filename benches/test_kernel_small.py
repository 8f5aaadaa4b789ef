"""Kernel lab: the memory-bound small kernels in GB/s: RMSNorm (and the fused residual add +
RMSNorm), per-head q/k RMSNorm + RoPE, and sampling (greedy, temperature, top-k/top-p).

Floor: the bytes each kernel must move (inputs read once, outputs written once; in-place
tensors read and written) over the measured copy bandwidth. Each kernel is checked before
timing: norms and RoPE against a float64 computation by the flash-attention rule (the
low-precision run being the reference's own bf16 math), sampling token for token against
``reference.sampling`` (same counter-based randomness), logprobs to 1e-3.
"""

from __future__ import annotations

import zlib

import pytest
import torch

import _ours
from _bench import Scale, flash_rule, rotation_sets, scale_name, time_fn
from reference import SamplingParams
from reference.model import apply_rope, rms_norm, rope_cos_sin

GROUP = "kernel_small"

# ---------------------------------------------------------------- problem sizes (one table)
HIDDEN = {"cpu": 64, "gpu": 4096}                                    # qwen3-8b hidden size
HEADS = {"cpu": (4, 2, 32), "gpu": (32, 8, 128)}                     # n_q, n_kv, D
TOKENS = {"cpu": (4, 64), "gpu": (64, 1024, 16384)}                  # rows of the norm / rope problems
VOCAB = {"cpu": 512, "gpu": 151936}
SAMPLE_BATCH = {"cpu": (1, 8), "gpu": (1, 64, 256)}
SAMPLE_CHECK_ROWS = 16                                               # rows checked against the CPU reference
SAMPLING = {
    "greedy": dict(temperature=0.0),
    "t=1": dict(temperature=1.0),
    "t=0.8 k=50 p=0.95": dict(temperature=0.8, top_k=50, top_p=0.95),   # top-k <= 64: the candidate path
    "t=1 p=0.95": dict(temperature=1.0, top_p=0.95),                     # top-p alone: passes over the row
}
EPS = 1e-6
MAX_POS = 8192


def pytest_generate_tests(metafunc):
    if "kernel" in metafunc.fixturenames:
        s = scale_name(metafunc.config)
        cases = [(k, n) for k in ("rmsnorm", "add_rmsnorm", "qk_norm_rope") for n in TOKENS[s]]
        cases += [(f"sample {m}", b) for m in SAMPLING for b in SAMPLE_BATCH[s]]
        metafunc.parametrize("kernel,n", [pytest.param(k, n, id=f"{k.replace(' ', '_')}-{n}") for k, n in cases])


@pytest.fixture(scope="module", autouse=True)
def _describe(results):
    results.describe(GROUP, "Kernel lab: RMSNorm, RoPE and sampling", columns=[
        ("kernel", "kernel", ""), ("n", "tokens / rows", ""), ("shape", "shape", ""),
        ("median_ms", "median ms", ".4g"), ("p10_ms", "p10 ms", ".4g"), ("p90_ms", "p90 ms", ".4g"),
        ("GBps", "GB/s", ".1f"), ("pct_copy", "% of copy", ".1f"), ("floor_ms", "floor ms", ".4g"),
        ("err_max", "max err", ".2e"), ("agree", "tokens agree", ".3f"), ("sets", "rotated sets", "")],
        plots=[dict(x="n", y="pct_copy", series="kernel", logx=True, xlabel="tokens (norms, rope) / rows (sampling)",
                    ylabel="% of copy ceiling", title="small kernels")])


def _f64(t):
    return t.double()


def _rms64(x, w):
    x = x.double()
    return w.double() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def test_small(benchmark, scale: Scale, ceilings, results, kernel, n):
    dev = scale.device
    dt = torch.bfloat16 if scale.gpu else torch.float32
    el = torch.tensor([], dtype=dt).element_size()
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{kernel}/{n}".encode()))
    rnd = lambda *shape: torch.randn(*shape, device=dev, generator=gen)  # noqa: E731
    check: dict = {}
    extra: dict = {}
    if kernel in ("rmsnorm", "add_rmsnorm"):
        H = HIDDEN[scale.name]
        w = (1 + 0.1 * rnd(H)).to(dt)
        moved = (2 if kernel == "rmsnorm" else 4) * n * H * el + H * el
        sets = rotation_sets(moved)
        xs = [rnd(n, H).to(dt) for _ in range(sets)]
        shape = f"[{n}, {H}]"
        if kernel == "rmsnorm":
            fns = [_ours.rmsnorm(scale, x, w, EPS) for x in xs]
            check = flash_rule(fns[0]().float(), _rms64(xs[0], w), rms_norm(xs[0], w, EPS), f"rmsnorm {shape}")
        else:
            rs = [rnd(n, H).to(dt) for _ in range(sets)]
            r0 = rs[0].clone()
            fns = [_ours.add_rmsnorm(scale, x, r, w, EPS) for x, r in zip(xs, rs)]
            out = fns[0]().float()
            s64 = r0.double() + xs[0].double()
            s_low = r0 + xs[0]
            check = flash_rule(out, _rms64(s64, w), rms_norm(s_low, w, EPS), f"add_rmsnorm {shape}")
            flash_rule(rs[0].float(), s64, s_low, f"add_rmsnorm residual {shape}")
    elif kernel == "qk_norm_rope":
        nq, nkv, D = HEADS[scale.name]
        cos, sin = rope_cos_sin(torch.arange(MAX_POS), D, 1e6)                  # fp32 [L, D]
        cos_h, sin_h = cos[:, :D // 2].contiguous().to(dev), sin[:, :D // 2].contiguous().to(dev)
        qw, kw = (1 + 0.1 * rnd(D)).to(dt), (1 + 0.1 * rnd(D)).to(dt)
        moved = 2 * n * (nq + nkv) * D * el + 2 * n * (D // 2) * 4 + n * 4
        sets = rotation_sets(moved)
        qs = [rnd(n, nq, D).to(dt) for _ in range(sets)]
        ks = [rnd(n, nkv, D).to(dt) for _ in range(sets)]
        pos = [torch.randint(0, MAX_POS, (n,), device=dev, generator=gen, dtype=torch.int32) for _ in range(sets)]
        q0, k0 = qs[0].clone(), ks[0].clone()
        fns = [_ours.qk_norm_rope(scale, q, k, qw, kw, cos_h, sin_h, p, EPS) for q, k, p in zip(qs, ks, pos)]
        fns[0]()
        p0 = pos[0].long().cpu()
        c64, s64 = rope_cos_sin(p0.double(), D, 1e6)
        c64, s64 = c64.double().to(dev), s64.double().to(dev)   # (fp32 angles; the reference's own table)
        c32, s32 = cos[p0].to(dev), sin[p0].to(dev)

        def rope64(x):
            half = x.shape[-1] // 2
            rot = torch.cat([-x[..., half:], x[..., :half]], -1)
            return x * c64[:, None] + rot * s64[:, None]

        check = flash_rule(qs[0].float(), rope64(_rms64(q0, qw)), apply_rope(rms_norm(q0, qw, EPS), c32, s32),
                           f"qk_norm_rope q [{n}, {nq}, {D}]")
        flash_rule(ks[0].float(), rope64(_rms64(k0, kw)), apply_rope(rms_norm(k0, kw, EPS), c32, s32),
                   f"qk_norm_rope k [{n}, {nkv}, {D}]")
        shape = f"q [{n}, {nq}, {D}], k [{n}, {nkv}, {D}]"
    else:
        mode = kernel.split(" ", 1)[1]
        V = VOCAB[scale.name]
        B = n
        moved = B * V * 4 + B * 8
        sets = rotation_sets(moved)
        logits = [3.0 * rnd(B, V) for _ in range(sets)]
        params = [SamplingParams(**SAMPLING[mode], seed=1000 + b, max_tokens=1, stop_token_ids=()) for b in range(B)]
        positions = [100 + 37 * b for b in range(B)]
        fns = [_ours.sample(scale, lg, params, positions) for lg in logits]
        toks, lps = fns[0]()
        toks = torch.as_tensor(toks).cpu().tolist()
        lps = torch.as_tensor(lps).cpu().double()
        rows = sorted(set(round(i * (B - 1) / max(1, SAMPLE_CHECK_ROWS - 1)) for i in range(min(B, SAMPLE_CHECK_ROWS))))
        from reference.sampling import sample_batch
        rt, rl = sample_batch(logits[0][rows].cpu(), [params[r] for r in rows], [positions[r] for r in rows])
        agree = sum(int(toks[r] == t) for r, t in zip(rows, rt)) / len(rows)
        lp_err = max(abs(float(lps[r]) - lp) for r, lp, t in zip(rows, rl, rt) if toks[r] == t) if agree else float("inf")
        need = 1.0 if mode == "greedy" else 0.9
        assert agree >= need, f"sample {mode} B={B}: tokens agree with reference.sampling on {agree:.2%} of rows (< {need:.0%})"
        assert lp_err <= 1e-3, f"sample {mode} B={B}: logprob error {lp_err:.2e} > 1e-3"
        extra = {"agree": agree, "lp_err": lp_err}
        shape = f"logits [{B}, {V}] fp32"

    t = time_fn(benchmark, lambda i: fns[i](), scale, sets=len(fns))
    gbps = moved / (t.median_ms / 1e3) / 1e9
    results.add(GROUP, kernel=kernel, n=n, shape=shape, **t.as_dict(), GBps=gbps, bytes=moved,
                pct_copy=100 * gbps / ceilings["copy_GBps"], floor_ms=moved / (ceilings["copy_GBps"] * 1e9) * 1e3,
                sets=t.sets, **check, **extra)
    benchmark.extra_info.update({"GBps": gbps, "median_ms": t.median_ms})
