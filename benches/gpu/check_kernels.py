#!/usr/bin/env python
"""GPU self-check of the optimized engine's CUDA kernels against their reference twins.

    python benches/gpu/check_kernels.py [--seed N] [--time] [--only SECTION ...]

Every op of ``optimized/ops.py`` runs on random inputs (a fresh seed each run, printed; ``--seed``
replays one) and is compared with its twin in ``reference/`` run in fp32 on the CPU on the same
bf16-rounded inputs. Floating-point outputs obey the flash-attention rule:

    error(ours vs fp32 reference) <= 2 x error(bf16 torch run of the same math vs fp32 reference)
                                     + one bf16 rounding step (2^-8 x the reference's magnitude)

checked on the max and on the mean of the absolute error (both printed before the verdict).
Attention caches hold NaN in every slot no sequence owns (unused pages, and the tail of last
pages), and padding query rows hold NaN too: a kernel that reads or multiplies one fails.
Sampling: greedy tokens must be equal; sampled tokens must equal ``reference.sampling.sample_one``
on >= 95% of rows (share printed); logprobs within 1e-3 where the tokens agree.

Every check runs (no stop at the first failure); a summary table follows; the exit status is
non-zero if any check failed. ``--time`` also times split-KV decode and paged prefill with CUDA
events after warm-up (GB/s of K/V read; TFLOP/s of causal attention) next to torch SDPA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from reference import attention as ref_attn  # noqa: E402
from reference import model as ref_model  # noqa: E402
from reference import sampling as ref_samp  # noqa: E402
from reference.types import SamplingParams  # noqa: E402

from optimized import kernels, ops  # noqa: E402

STEP = 2.0 ** -8  # one bf16 rounding step, relative


# --------------------------------------------------------------------------------------
# bookkeeping
# --------------------------------------------------------------------------------------

class Checks:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, bool, str]] = []

    def record(self, section: str, case: str, ok: bool, detail: str) -> None:
        self.rows.append((section, case, ok, detail))
        print(f"  [{'ok' if ok else 'FAIL'}] {section} / {case}: {detail}", flush=True)

    def run(self, section: str, case: str, fn) -> None:
        """``fn`` returns a list of (ok, detail) pairs; an exception is one failure."""
        try:
            for ok, detail in fn():
                self.record(section, case, bool(ok), detail)
        except Exception as e:  # noqa: BLE001 -- collect every failure
            traceback.print_exc()
            self.record(section, case, False, f"exception: {type(e).__name__}: {e}")

    def summary(self) -> int:
        print("\n" + "=" * 100)
        print(f"{'section':<16} {'case':<44} {'result':<6} detail")
        print("-" * 100)
        for section, case, ok, detail in self.rows:
            print(f"{section:<16} {case[:44]:<44} {'ok' if ok else 'FAIL':<6} {detail[:120]}")
        failed = sum(1 for r in self.rows if not r[2])
        print("-" * 100)
        print(f"{len(self.rows) - failed} passed, {failed} failed")
        return 1 if failed else 0


def fa_rule(name: str, ours: torch.Tensor, ref32: torch.Tensor, refbf: torch.Tensor,
            mask: torch.Tensor | None = None) -> list[tuple[bool, str]]:
    """The flash-attention rule on max and mean abs error; also requires finite output."""
    o = ours.detach().double().cpu()
    r = ref32.detach().double().cpu()
    b = refbf.detach().double().cpu()
    if mask is not None:
        m = mask.cpu()
        o, r, b = o[m], r[m], b[m]
    finite = bool(torch.isfinite(o).all())
    if o.numel() == 0:
        return [(True, f"{name}: empty")]
    e, eb = (o - r).abs(), (b - r).abs()
    mag_max, mag_mean = float(r.abs().max()), float(r.abs().mean())
    emax, emean = float(e.max()), float(e.mean())
    bmax, bmean = float(eb.max()), float(eb.mean())
    tmax, tmean = 2 * bmax + STEP * mag_max, 2 * bmean + STEP * mag_mean
    detail = (f"{name}: max {emax:.3e} (bf16 run {bmax:.3e}, bound {tmax:.3e}) "
              f"mean {emean:.3e} (bf16 run {bmean:.3e}, bound {tmean:.3e})" + ("" if finite else " NON-FINITE"))
    print(f"    {detail}")
    return [(finite and emax <= tmax and emean <= tmean, detail)]


def exact(name: str, ours: torch.Tensor, ref: torch.Tensor) -> list[tuple[bool, str]]:
    o, r = ours.detach().cpu(), ref.detach().cpu()
    if o.dtype == torch.bfloat16:
        o, r = o.view(torch.int16), r.view(torch.int16)
    same = bool(torch.equal(o, r))
    bad = int((o != r).sum()) if o.shape == r.shape else -1
    return [(same, f"{name}: {'bitwise equal' if same else f'{bad} elements differ'}")]


def bf16_agreement(ours: torch.Tensor, refbf: torch.Tensor) -> str:
    a = ours.detach().cpu().view(torch.int16)
    b = refbf.detach().cpu().to(torch.bfloat16).view(torch.int16)
    return f"bitwise-equal share vs torch bf16 run {float((a == b).double().mean()):.4f}"


# --------------------------------------------------------------------------------------
# paged caches
# --------------------------------------------------------------------------------------

def build_paged(lens: list[int], bs: int, n_kv: int, D: int, gen: torch.Generator, dev: torch.device,
                extra_pages: int = 5):
    """bf16 caches with NaN in every slot no sequence owns; random page order; int32 tables."""
    need = [-(-L // bs) for L in lens]
    num_blocks = sum(need) + extra_pages
    perm = torch.randperm(num_blocks, generator=gen)
    M = max(need + [1]) + 1
    bt = torch.full((len(lens), M), -1, dtype=torch.int32)
    valid = torch.zeros(num_blocks, bs, dtype=torch.bool)
    off = 0
    for b, (L, n) in enumerate(zip(lens, need)):
        pages = perm[off:off + n]
        off += n
        bt[b, :n] = pages.to(torch.int32)
        for j, pg in enumerate(pages.tolist()):
            valid[pg, : min(bs, L - j * bs)] = True
    k = (torch.randn(num_blocks, bs, n_kv, D, generator=gen) + 0.1).to(torch.bfloat16)
    v = (torch.randn(num_blocks, bs, n_kv, D, generator=gen) + 0.1).to(torch.bfloat16)
    k[~valid] = float("nan")
    v[~valid] = float("nan")
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return k.to(dev), v.to(dev), bt.to(dev), seq_lens.to(dev)


def ramp_keys(k: torch.Tensor, bt: torch.Tensor, lens: list[int], per: float) -> None:
    """Scale each sequence's key at position p by ``1 + p / per``, in place (the keys' scores grow along the
    sequence, so a query's running maximum keeps moving: the split-KV decode's rescale path runs, not only
    its first tile's)."""
    bs = k.shape[1]
    for b, L in enumerate(lens):
        pos = torch.arange(L, device=k.device)
        pages, slots = bt[b].long()[pos // bs], pos % bs
        k[pages, slots] = (k[pages, slots].float() * (1 + pos.float() / per)[:, None, None]).to(k.dtype)


def gather_dev(cache: torch.Tensor, row: torch.Tensor, start: int, end: int) -> torch.Tensor:
    bs = cache.shape[1]
    pos = torch.arange(start, end, device=cache.device)
    pages = row.long()[pos // bs]
    return cache[pages, pos % bs]


def dense_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qpos: torch.Tensor, scale: float) -> torch.Tensor:
    """The bf16 torch run: bf16 matmuls, fp32 softmax rounded to bf16. q [t, n_q, D], k/v [L, n_kv, D]."""
    n_q = q.shape[1]
    g = n_q // k.shape[1]
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    s = torch.einsum("thd,lhd->htl", q, kk) * scale                      # bf16
    vis = torch.arange(k.shape[0], device=q.device)[None, :] <= qpos[:, None]
    s = torch.where(vis[None], s, torch.full_like(s, float("-inf")))
    p = torch.softmax(s.float(), dim=-1)
    p = torch.where(vis[None], p, torch.zeros_like(p)).to(torch.bfloat16)
    return torch.einsum("htl,lhd->thd", p, vv)                          # bf16


# --------------------------------------------------------------------------------------
# attention checks
# --------------------------------------------------------------------------------------

def check_prefill(C: Checks, dev, gen) -> None:
    # (name, D, n_q, n_kv, block_size, [(seq_len, new_tokens, padding_rows_after_chunk)], interleave)
    cases = [
        ("d128 gqa4 bs16 empty prefix", 128, 32, 8, 16, [(100, 100, 0)], False),
        ("d128 gqa8 bs32 long prefix", 128, 64, 8, 32, [(3000, 70, 2)], False),
        ("d64 gqa2 bs16 several seqs+pad", 64, 16, 8, 16,
         [(1, 1, 3), (16, 16, 0), (17, 5, 1), (33, 33, 4), (64, 2, 0), (65, 65, 7), (200, 37, 2)], False),
        ("d32 gqa1 bs32 block boundaries", 32, 4, 4, 32, [(32, 32, 0), (64, 32, 1), (31, 31, 0), (33, 2, 5)], False),
        ("d128 gqa5 bs16 (qwen3-14b)", 128, 40, 8, 16, [(130, 130, 0), (257, 20, 3)], False),
        ("d64 gqa16 bs32", 64, 32, 2, 32, [(90, 90, 1), (40, 9, 0)], False),
        ("d128 gqa1 bs16", 128, 8, 8, 16, [(77, 77, 0), (160, 33, 1)], False),
        ("d64 gqa4 interleaved rows", 64, 16, 4, 16, [(50, 12, 0), (70, 12, 0), (20, 12, 0)], True),
        ("d128 gqa4 bs32 4097", 128, 32, 8, 32, [(4097, 129, 3)], False),
        ("d16 mha bs8", 16, 3, 3, 8, [(40, 40, 1), (90, 17, 2)], False),
        ("d64 gqa4 bs5 (not a power of two)", 64, 8, 2, 5, [(1, 1, 0), (5, 5, 1), (6, 2, 0), (131, 131, 2)], False),
        ("d128 gqa2 bs12 (not a power of two)", 128, 16, 8, 12, [(300, 45, 1), (24, 24, 0)], False),
    ]
    for name, D, n_q, n_kv, bs, seqs, interleave in cases:
        def run(name=name, D=D, n_q=n_q, n_kv=n_kv, bs=bs, seqs=seqs, interleave=interleave):
            lens = [s[0] for s in seqs]
            kc, vc, bt, sl = build_paged(lens, bs, n_kv, D, gen, dev)
            seq_idx, pos = [], []
            for b, (L, new, pad) in enumerate(seqs):
                seq_idx += [b] * new + [b if i % 2 else -1 for i in range(pad)]
                pos += list(range(L - new, L)) + [-1] * pad
            if interleave:
                order = torch.randperm(len(pos), generator=gen).tolist()
                seq_idx = [seq_idx[i] for i in order]
                pos = [pos[i] for i in order]
            T = len(pos)
            qi = torch.tensor(seq_idx, dtype=torch.int32, device=dev)
            qp = torch.tensor(pos, dtype=torch.int32, device=dev)
            q = torch.randn(T, n_q, D, generator=gen).to(torch.bfloat16)
            q[torch.tensor(pos) < 0] = float("nan")  # padding rows must not be read
            q = q.to(dev)
            scale = D ** -0.5
            outs = {v: ops.paged_prefill(q, kc, vc, bt, sl, qi, qp, scale, variant=v)
                    for v in ops.prefill_variants(D, q.device.index or 0)}
            torch.cuda.synchronize()
            ref32 = ref_attn.paged_prefill(q.float().cpu(), kc.float().cpu(), vc.float().cpu(), bt.long().cpu(),
                                           sl.long().cpu(), qi.long().cpu(), qp.long().cpu(), scale)
            refbf = torch.zeros(T, n_q, D, dtype=torch.bfloat16, device=dev)
            for b in range(len(lens)):
                rows = torch.nonzero((qi == b) & (qp >= 0)).flatten()
                if rows.numel() == 0:
                    continue
                Lb = int(qp[rows].max()) + 1
                refbf[rows] = dense_bf16(q[rows], gather_dev(kc, bt[b], 0, Lb), gather_dev(vc, bt[b], 0, Lb),
                                         qp[rows], scale)
            real = (qp >= 0).cpu()
            res = []
            for v, out in outs.items():
                res += fa_rule(f"out[{v}]", out, ref32, refbf, real[:, None, None].expand(T, n_q, D))
                pad_zero = bool((out[~real.to(dev)] == 0).all())
                res.append((pad_zero, f"[{v}] padding rows zero: {pad_zero}"))
            # a row's arithmetic depends on neither the rows per CTA nor the row tiles per warp nor the
            # MMA instruction (mma.sync or wgmma, each row's products chained in the same order):
            # variants with the same keys per tile must give the same bits
            tiles = ops.PREFILL_VARIANTS.get(D, {})
            first: dict[int, str] = {}
            for v, out in outs.items():
                bn = tiles[v][1]
                if bn in first:
                    same = torch.equal(out, outs[first[bn]])
                    res.append((same, f"[{v}] bitwise equal to [{first[bn]}] (BN={bn}): {same}"))
                else:
                    first[bn] = v
            return res
        C.run("paged_prefill", name, run)


def check_split_kv(C: Checks, dev, gen) -> None:
    lens = [1, 15, 16, 17, 4097]
    configs = [
        ("d128 gqa4 bs16", 128, 32, 8, 16, [1, 7, 16, 64, 1000]),
        ("d64 gqa2 bs32", 64, 16, 8, 32, [7, 16, 64, 1000]),
        ("d32 gqa1 bs16", 32, 4, 4, 16, [1, 16, 1000]),
        ("d128 gqa8 bs32", 128, 64, 8, 32, [16, 64, 1000]),
        ("d128 gqa5 bs16", 128, 40, 8, 16, [64]),
        ("d64 gqa32 bs16 (2 head groups)", 64, 32, 1, 16, [64, 7]),
        ("d16 mha bs8", 16, 3, 3, 8, [1, 5, 64, 1000]),
        ("d64 gqa4 bs5 (not a power of two)", 64, 8, 2, 5, [3, 7, 64, 1000]),
        # keys growing 17x along 4097 positions: each query's maximum rises by tens of log2 units, far past
        # the decode's rescale slack, so the kernel's reduce-and-rescale path runs again and again
        ("d128 gqa4 bs16 rising scores", 128, 32, 8, 16, [64, 1000], 256.0),
        ("d64 gqa2 bs32 rising scores", 64, 16, 8, 32, [1000], 256.0),
    ]
    for name, D, n_q, n_kv, bs, splits, *ramp in configs:
        kc, vc, bt, sl = build_paged(lens, bs, n_kv, D, gen, dev)
        if ramp:
            ramp_keys(kc, bt, lens, ramp[0])
        B = len(lens)
        q = (torch.randn(B, n_q, D, generator=gen) + 0.05).to(torch.bfloat16).to(dev)
        scale = D ** -0.5
        qc, kcc, vcc, btc, slc = q.float().cpu(), kc.float().cpu(), vc.float().cpu(), bt.long().cpu(), sl.long().cpu()
        ref32 = ref_attn.split_kv_decode(qc, kcc, vcc, btc, slc, None, scale)  # unsplit fp32
        refbf = torch.stack([dense_bf16(q[b:b + 1], gather_dev(kc, bt[b], 0, L), gather_dev(vc, bt[b], 0, L),
                                        torch.tensor([L - 1], device=dev), scale)[0] for b, L in enumerate(lens)])
        for S in splits:
            def run(S=S, D=D, n_q=n_q):
                res = []
                o_part, lse_part = ops.split_kv_partials(q, kc, vc, bt, sl, S, scale)
                out = ops.split_kv_reduce(o_part, lse_part)
                out2 = ops.split_kv_decode(q, kc, vc, bt, sl, S, scale)
                torch.cuda.synchronize()
                res += fa_rule(f"S={S} decode vs unsplit", out, ref32, refbf)
                res += exact("split_kv_decode == partials+reduce", out2, out)
                # empty splits: o = 0 and lse = -inf exactly; no NaN anywhere
                nsp = torch.tensor([-(-L // S) for L in lens])
                idx = torch.arange(o_part.shape[1])
                empty = (idx[None, :] >= nsp[:, None]).to(dev)  # [B, S]
                lp, op_ = lse_part.cpu(), o_part.cpu()
                emp = empty.cpu()
                ok_empty = bool((lp[emp] == float("-inf")).all()) and bool((op_[emp] == 0).all())
                res.append((ok_empty, f"{int(emp.sum())} empty split slots: o=0, lse=-inf: {ok_empty}"))
                nonfinite = int((~torch.isfinite(op_)).sum())
                res.append((nonfinite == 0, f"o_part non-finite entries: {nonfinite}"))
                if S >= 16 or max(lens) <= 100:
                    ro, rl = ref_attn.split_kv_partials(qc, kcc, vcc, btc, slc, S, scale, max_splits=o_part.shape[1])
                    fin = torch.isfinite(rl)
                    lerr = float((lp[fin] - rl[fin]).abs().max()) if fin.any() else 0.0
                    oerr = float((op_ - ro).abs().max())
                    same_inf = bool(torch.equal(torch.isfinite(lp), fin))
                    ok = same_inf and lerr <= 2e-2 and oerr <= 2e-2 * max(1.0, float(ro.abs().max()))
                    res.append((ok, f"partials vs reference: lse max err {lerr:.2e}, o max err {oerr:.2e}, "
                                    f"empty pattern equal {same_inf}"))
                # reduce alone vs reference reduce_splits on our partials (same fp32 inputs)
                rr, rlse = ref_attn.reduce_splits(op_, lp)
                lse_out = torch.empty(q.shape[0], n_q, dtype=torch.float32, device=dev)
                out3 = ops.split_kv_reduce(o_part, lse_part, lse_out=lse_out)
                err = float((out3.float().cpu() - rr).abs().max())
                bound = STEP * float(rr.abs().max())
                lerr = float((lse_out.cpu() - rlse).abs().max())
                res.append((err <= bound and lerr <= 1e-4,
                            f"reduce vs reduce_splits: o max err {err:.2e} (bound {bound:.2e}), lse {lerr:.2e}"))
                return res
            C.run("split_kv", f"{name} S={S}", run)


def check_merge(C: Checks, dev, gen) -> None:
    def run():
        N, R, D = 6, 37, 128
        o = torch.randn(N, R, D, generator=gen)
        lse = torch.randn(N, R, generator=gen) * 4
        lse[1, :] = float("-inf")          # an empty state
        lse[:, 5] = float("-inf")          # a row empty in every state
        lse[0, 7:12] = float("-inf")       # empty first states
        o[lse == float("-inf")] = 0.0
        states = [ref_attn.PartialState(o[i], lse[i], i) for i in range(N)]
        ro, rl = ref_attn.merge_states(states)
        mo, ml = ops.merge_states(o.to(dev), lse.to(dev))
        torch.cuda.synchronize()
        oerr = float((mo.cpu() - ro).abs().max())
        fin = torch.isfinite(rl)
        lerr = float((ml.cpu()[fin] - rl[fin]).abs().max())
        inf_ok = bool(torch.equal(torch.isfinite(ml.cpu()), fin)) and bool((mo.cpu()[~fin] == 0).all())
        return [(oerr <= 1e-5 and lerr <= 1e-5 and inf_ok,
                 f"o max err {oerr:.2e}, lse max err {lerr:.2e}, empty rows -> o=0/lse=-inf: {inf_ok}")]
    C.run("merge_states", "N=6 R=37 D=128 with empty states", run)


# --------------------------------------------------------------------------------------
# elementwise / norm checks
# --------------------------------------------------------------------------------------

def check_elementwise(C: Checks, dev, gen) -> None:
    eps = 1e-6

    def rms32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x = x.double()
        return (w.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def run_rms():
        res = []
        for T, H in ((37, 4096), (5, 1024), (3, 5120), (1, 64)):
            x = (torch.randn(T, H, generator=gen) * 2 + 0.1).to(torch.bfloat16)
            w = (torch.rand(H, generator=gen) + 0.5).to(torch.bfloat16)
            ours = ops.rmsnorm(x.to(dev), w.to(dev), eps)
            refbf = ref_model.rms_norm(x, w, eps)
            res += fa_rule(f"rmsnorm T={T} H={H}", ours, rms32(x, w), refbf)
            res[-1] = (res[-1][0], res[-1][1] + "; " + bf16_agreement(ours, refbf))
        return res

    def run_add_rms():
        res = []
        for T, H in ((19, 4096), (2, 1024)):
            x = (torch.randn(T, H, generator=gen) + 0.1).to(torch.bfloat16)
            r = (torch.randn(T, H, generator=gen) * 3).to(torch.bfloat16)
            w = (torch.rand(H, generator=gen) + 0.5).to(torch.bfloat16)
            new_r = r + x  # bf16 add, one rounding (computed before the in-place op)
            rd = r.clone().to(dev)
            ours = ops.add_rmsnorm(x.to(dev), rd, w.to(dev), eps)
            res += exact(f"add_rmsnorm residual T={T}", rd, new_r)
            res += fa_rule(f"add_rmsnorm T={T} H={H}", ours, rms32(new_r, w), ref_model.rms_norm(new_r, w, eps))
        return res

    def run_rope():
        res = []
        theta = 1e6
        for T, n_q, n_kv, D in ((23, 32, 8, 128), (4, 4, 2, 64), (3, 4, 4, 32)):
            max_pos = 5000
            positions = torch.randint(0, max_pos, (T,), generator=gen)
            cos_full, sin_full = ref_model.rope_cos_sin(torch.arange(max_pos), D, theta)  # [max_pos, D]
            cos_t, sin_t = cos_full[:, : D // 2].contiguous(), sin_full[:, : D // 2].contiguous()
            q = (torch.randn(T, n_q, D, generator=gen) * 2).to(torch.bfloat16)
            k = (torch.randn(T, n_kv, D, generator=gen) * 2).to(torch.bfloat16)
            qw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16)
            kw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16)
            # q and k as column slices of one fused buffer (row strides), like a qkv projection output
            fused = torch.empty(T, (n_q + 2 * n_kv) * D, dtype=torch.bfloat16, device=dev)
            fused[:, : n_q * D] = q.view(T, -1).to(dev)
            fused[:, n_q * D:(n_q + n_kv) * D] = k.view(T, -1).to(dev)
            qd = fused[:, : n_q * D].view(T, n_q, D)
            kd = fused[:, n_q * D:(n_q + n_kv) * D].view(T, n_kv, D)
            ops.qk_norm_rope(qd, kd, qw.to(dev), kw.to(dev), cos_t.to(dev), sin_t.to(dev),
                             positions.to(torch.int32).to(dev), eps)
            cos, sin = ref_model.rope_cos_sin(positions, D, theta)
            for name, x, w, ours in (("q", q, qw, qd), ("k", k, kw, kd)):
                refbf = ref_model.apply_rope(ref_model.rms_norm(x, w, eps), cos, sin)
                x32 = x.double()
                n32 = w.double() * x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
                half = D // 2
                rot = torch.cat([-n32[..., half:], n32[..., :half]], dim=-1)
                ref32 = n32 * cos.double()[:, None, :] + rot * sin.double()[:, None, :]
                r = fa_rule(f"qk_norm_rope {name} T={T} D={D}", ours, ref32, refbf)
                res.append((r[0][0], r[0][1] + "; " + bf16_agreement(ours, refbf)))
        return res

    def run_silu():
        res = []
        for T, I in ((17, 12288), (3, 64)):
            x = (torch.randn(T, 2 * I, generator=gen) * 2).to(torch.bfloat16)
            ours = ops.silu_mul(x.to(dev))
            g, u = x[:, :I], x[:, I:]
            ref32 = torch.nn.functional.silu(g.double()) * u.double()
            refbf = torch.nn.functional.silu(g) * u
            res += fa_rule(f"silu_mul T={T} I={I}", ours, ref32, refbf)
        return res

    def run_embed():
        V, H, T = 1000, 256, 33
        table = torch.randn(V, H, generator=gen).to(torch.bfloat16)
        ids = torch.randint(0, V, (T,), generator=gen).to(torch.int32)
        ours = ops.embedding(ids.to(dev), table.to(dev))
        return exact("embedding", ours, table[ids.long()])

    def run_embed_norm():
        """``embed_rmsnorm`` bitwise ``embedding`` then ``rmsnorm`` (residual and normed rows), ids out of range
        included (zero rows), at Qwen3's widths, one of more than 8 x 1024 columns (the kernel's loop path)."""
        res = []
        for V, H, T in ((1000, 4096, 33), (500, 1024, 1), (300, 5120, 7), (64, 16384, 3), (77, 64, 5)):
            table = (torch.randn(V, H, generator=gen) * 0.5).to(torch.bfloat16).to(dev)
            w = (torch.rand(H, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
            ids = torch.randint(0, V, (T,), generator=gen).to(torch.int32)
            if T > 2:
                ids[1], ids[2] = -1, V                      # out of range: zero rows
            ids = ids.to(dev)
            resid, normed = ops.embed_rmsnorm(ids, table, w, eps)
            want_r = ops.embedding(ids, table)
            res += exact(f"embed_rmsnorm residual V={V} H={H} T={T}", resid, want_r)
            res += exact(f"embed_rmsnorm normed V={V} H={H} T={T}", normed, ops.rmsnorm(want_r, w, eps))
        return res

    def run_store():
        res = []
        for n_kv, D, bs in ((8, 128, 16), (2, 64, 32)):
            T, nb = 29, 6
            kc = torch.full((nb, bs, n_kv, D), float("nan"), dtype=torch.bfloat16)
            vc = kc.clone()
            slots = torch.randperm(nb * bs, generator=gen)[:T].to(torch.int32)
            slots[3] = -1
            slots[10] = -1
            fused = (torch.randn(T, 3 * n_kv * D, generator=gen)).to(torch.bfloat16)
            k = fused[:, n_kv * D: 2 * n_kv * D].view(T, n_kv, D)
            v = fused[:, 2 * n_kv * D:].view(T, n_kv, D)
            kcd, vcd, fd = kc.to(dev), vc.to(dev), fused.to(dev)
            ops.store_kvcache(fd[:, n_kv * D: 2 * n_kv * D].view(T, n_kv, D), fd[:, 2 * n_kv * D:].view(T, n_kv, D),
                              kcd, vcd, slots.to(dev))
            keep = slots >= 0
            s = slots[keep].long()
            kc[s // bs, s % bs] = k[keep]
            vc[s // bs, s % bs] = v[keep]
            res += exact(f"store_kvcache k n_kv={n_kv} D={D}", kcd, kc)
            res += exact(f"store_kvcache v n_kv={n_kv} D={D}", vcd, vc)
        return res

    C.run("rmsnorm", "rmsnorm", run_rms)
    C.run("rmsnorm", "add_rmsnorm", run_add_rms)
    C.run("rope", "qk_norm_rope (strided q/k)", run_rope)
    C.run("activation", "silu_mul", run_silu)
    C.run("embedding", "embedding", run_embed)
    C.run("embedding", "embed_rmsnorm (= embedding + rmsnorm)", run_embed_norm)
    C.run("kv_cache", "store_kvcache (strided k/v, -1 slots)", run_store)


# --------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------

def check_sampling(C: Checks, dev, gen) -> None:
    def rows_for(V: int, n: int, ties: bool) -> torch.Tensor:
        scale = torch.tensor([1.0, 3.0, 8.0, 30.0])[torch.randint(0, 4, (n,), generator=gen)]   # 30: most entries far below the max
        x = torch.randn(n, V, generator=gen) * scale[:, None]
        if ties:
            x = torch.round(x * 2) / 2
        return x

    settings = [  # (temperature, top_k, top_p)
        (0.7, 50, 0.9), (1.0, 0, 1.0), (1.3, 0, 0.95), (0.8, 20, 1.0), (1.0, 1, 1.0), (0.6, 100000, 0.5),
        (1.0, 0, 0.8), (2.0, 5, 0.99),
    ]

    plain = [(0.7, 0, 1.0), (1.0, 0, 1.0), (1.3, 0, 1.0), (1.0, 151936, 1.0)]   # no filter: partials only

    def run_case(V: int, n_rows: int, ties: bool, greedy: bool, table=None, masked: bool = False, make=None):
        logits = rows_for(V, n_rows, ties) if make is None else make(V, n_rows)
        if masked:  # whole chunks of -inf (sample_partial's chunks are 4096 wide) and scattered -inf entries
            logits[:, : 3 * 4096] = float("-inf")
            logits[torch.rand(logits.shape, generator=gen) < 0.3] = float("-inf")
        table = table or settings
        params, positions = [], []
        for i in range(n_rows):
            seed = int(torch.randint(0, 2**62, (1,), generator=gen)) * 3 + i
            mode = "processed" if i % 2 else "raw"
            if greedy:
                sp = SamplingParams(temperature=0.0, seed=seed, logprobs_mode=mode)
            else:
                t, k, p = table[i % len(table)]
                sp = SamplingParams(temperature=t, top_k=k, top_p=p, seed=seed, logprobs_mode=mode)
            params.append(sp)
            positions.append(int(torch.randint(0, 100000, (1,), generator=gen)))
        pk = ops.pack_sampling_params(params, positions, dev)
        toks, lps = ops.sample(logits.to(dev), **pk)
        torch.cuda.synchronize()
        toks, lps = toks.cpu().tolist(), lps.cpu().tolist()
        agree, lp_err, lp_bad, ref_nan = 0, 0.0, 0, 0
        for i in range(n_rows):
            rt, rlp = ref_samp.sample_one(logits[i], params[i], positions[i])
            if rt == toks[i]:
                agree += 1
                err = abs(rlp - lps[i])
                lp_err = max(lp_err, err)
                lp_bad += err > 1e-3
                continue
            # explain the disagreement with the reference's own quantities
            sp = params[i]
            fl = ref_samp.filtered_logits(logits[i], sp) if sp.temperature > 0 else logits[i]
            g = ref_samp.gumbel(sp.seed, positions[i], V) if sp.temperature > 0 else torch.zeros(V)
            ours_t = toks[i]
            if sp.temperature > 0 and not bool(torch.isfinite(fl[rt])):
                # the reference's u_i = ((r>>8) + 0.5) / 2^24 rounds to 1.0 in float32 when r>>8 = 2^24-1,
                # so g_i = +inf and a *filtered* entry gets l + g = -inf + inf = NaN, which torch.argmax
                # returns: the reference then samples a token its own filters removed.
                ref_nan += 1
            print(f"    row {i}: T={sp.temperature} k={sp.top_k} p={sp.top_p}: ours {ours_t} "
                  f"(ref filtered l={float(fl[ours_t]):.6g}, l+g={float(fl[ours_t] + g[ours_t]):.9g}) vs ref {rt} "
                  f"(l={float(fl[rt]):.6g}, l+g={float(fl[rt] + g[rt]):.9g}, g={float(g[rt]):.6g}); "
                  f"survivors in ref {int(torch.isfinite(fl).sum())}")
        counted = n_rows - ref_nan
        share = agree / max(1, counted)
        need = 1.0 if greedy else 0.95
        note = (f"; {ref_nan} row(s) left out where the reference picked a filtered token through "
                f"u=1 -> g=+inf -> NaN (a reference bug)") if ref_nan else ""
        return [(share >= need, f"token agreement {agree}/{counted} = {share:.3f} (need {need:.2f}){note}"),
                (lp_bad == 0, f"logprob max abs err {lp_err:.2e} on agreeing rows ({lp_bad} over 1e-3)")]

    C.run("sampling", "greedy V=151936", lambda: run_case(151936, 24, False, True))
    C.run("sampling", "greedy V=151936 with ties", lambda: run_case(151936, 16, True, True))
    C.run("sampling", "sampled V=151936", lambda: run_case(151936, 64, False, False))
    C.run("sampling", "sampled V=151936 with ties", lambda: run_case(151936, 32, True, False))
    C.run("sampling", "sampled V=1000", lambda: run_case(1000, 64, False, False))
    C.run("sampling", "sampled V=7 (< threads)", lambda: run_case(7, 32, False, False))
    C.run("sampling", "plain rows V=151936 (no filter)", lambda: run_case(151936, 64, False, False, plain))
    C.run("sampling", "plain rows V=151935 (scalar loads)", lambda: run_case(151935, 32, False, False, plain))
    C.run("sampling", "plain rows V=4100 (two chunks, ties)", lambda: run_case(4100, 32, True, False, plain))
    C.run("sampling", "greedy with -inf chunks", lambda: run_case(151936, 16, False, True, masked=True))
    C.run("sampling", "plain rows with -inf chunks", lambda: run_case(151936, 16, False, False, plain, masked=True))
    C.run("sampling", "filtered rows with -inf chunks", lambda: run_case(151936, 16, False, False, masked=True))
    # top-k rows with k <= ops.SAMPLE_TOPK_CAP filter over their chunks' exported candidates
    small_k = [(0.6, 20, 0.95), (1.0, 64, 1.0), (0.8, 1, 1.0), (1.2, 7, 0.5), (0.7, 65, 0.9), (1.0, 33, 0.99)]
    C.run("sampling", "small top-k rows (candidates)", lambda: run_case(151936, 48, False, False, small_k))
    C.run("sampling", "small top-k rows with ties (candidates or overflow)",
          lambda: run_case(151936, 48, True, False, small_k))
    C.run("sampling", "small top-k rows, every logit tied (chunks overflow: whole-row passes)",
          lambda: run_case(151936, 12, False, False, small_k, make=lambda V, n: torch.zeros(n, V) + 0.5))

    def many_candidates(V: int, n: int) -> torch.Tensor:   # 100 tied maxima per chunk: 3800 > NCAND candidates
        x = torch.randn(n, V, generator=gen)
        for c in range(0, V, 4096):
            x[:, c + torch.randperm(min(4096, V - c), generator=gen)[:100]] = 5.0
        return x
    C.run("sampling", "small top-k rows over the row's candidate room (whole-row passes)",
          lambda: run_case(151936, 12, False, False, small_k, make=many_candidates))
    # top-p rows without top-k filter over their chunks' candidates when the logits are peaked
    top_p_only = [(1.0, 0, 0.95), (0.7, 0, 0.9), (1.3, 151936, 0.5), (1.0, 0, 0.99), (0.6, 0, 0.999)]
    C.run("sampling", "top-p rows, peaked logits (candidates)",
          lambda: run_case(151936, 40, False, False, top_p_only, make=lambda V, n: torch.randn(n, V, generator=gen) * 30))
    C.run("sampling", "top-p rows, flat and tied logits (whole-row passes)",
          lambda: run_case(151936, 10, False, False, top_p_only, make=lambda V, n: torch.zeros(n, V) - 2.0)
          + run_case(151936, 20, True, False, top_p_only))
    C.run("sampling", "small top-k rows, V=4100 and V=7", lambda: run_case(4100, 24, False, False, small_k)
          + run_case(7, 24, False, False, [(1.0, 3, 1.0), (0.5, 1, 0.8), (1.0, 6, 0.9)]))

    def run_hash():  # flat logits: the token is argmax of the Gumbel noise alone -> exercises the hash
        V, n = 50000, 16
        logits = torch.zeros(n, V) + 0.25
        params = [SamplingParams(temperature=1.0, seed=(2**64 - 1 - i * 977) % 2**64) for i in range(n)]
        positions = [i * 12345 for i in range(n)]
        toks, _ = ops.sample(logits.to(dev), **ops.pack_sampling_params(params, positions, dev))
        ref = [ref_samp.sample_one(logits[i], params[i], positions[i])[0] for i in range(n)]
        same = sum(int(a == b) for a, b in zip(toks.cpu().tolist(), ref))
        return [(same == n, f"flat logits (pure Gumbel argmax): {same}/{n} equal")]

    C.run("sampling", "counter hash (flat logits, 64-bit seeds)", run_hash)

    def run_u1():
        # seed 7, position 195: u_44323 = ((r>>8) + 0.5) / 2^24 rounds to 1.0 in float32, so g = +inf.
        # Only token 5 survives top_k=1: the kernel must return it (the reference's argmax over
        # l + g sees -inf + inf = NaN at 44323 and returns that filtered token instead).
        V = 151936
        logits = torch.zeros(1, V)
        logits[0, 5] = 10.0
        sp = SamplingParams(temperature=1.0, top_k=1, seed=7)
        g = ref_samp.gumbel(7, 195, V)
        toks, _ = ops.sample(logits.to(dev), **ops.pack_sampling_params([sp], [195], dev))
        ours = int(toks[0])
        ref = ref_samp.sample_one(logits[0], sp, 195)[0]
        return [(ours == 5, f"g[44323] = {float(g[44323])}; kernel -> {ours} (survivor 5 expected); "
                            f"reference sample_one -> {ref}")]

    C.run("sampling", "u=1 edge (g=+inf on a filtered entry)", run_u1)

    def run_repro():
        V, n = 151936, 8
        logits = rows_for(V, n, False).to(dev)
        params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=11 + i) for i in range(n)]
        pk = ops.pack_sampling_params(params, list(range(n)), dev)
        a = ops.sample(logits, **pk)[0].cpu()
        b = ops.sample(logits, **pk)[0].cpu()
        # batch invariance: row 3 alone gives the same token
        pk1 = {k: v[3:4].contiguous() for k, v in pk.items()}
        c = ops.sample(logits[3:4].contiguous(), **pk1)[0].cpu()
        return [(bool(torch.equal(a, b)) and int(c[0]) == int(a[3]), "run-to-run and batch-composition reproducible")]

    C.run("sampling", "reproducibility", run_repro)


# --------------------------------------------------------------------------------------
# CUDA graph capture
# --------------------------------------------------------------------------------------

def check_graph(C: Checks, dev, gen) -> None:
    """Kernels launched on the current torch stream are captured by torch.cuda.graph and replay
    bitwise like eager launches, also after the inputs change in place."""
    def run():
        D, n_q, n_kv, H = 128, 32, 8, 1024
        kc, vc, bt, sl = build_paged([300, 1000, 17], 16, n_kv, D, gen, dev)
        q = torch.randn(3, n_q, D, generator=gen).to(torch.bfloat16).to(dev)
        x = torch.randn(3, H, generator=gen).to(torch.bfloat16).to(dev)
        w = (torch.rand(H, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
        logits = torch.randn(3, 151936, generator=gen).to(dev)
        params = [SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=5 + i) for i in range(3)]
        pk = ops.pack_sampling_params(params, [10, 20, 30], dev)

        def step():
            return (ops.split_kv_decode(q, kc, vc, bt, sl, 64), ops.rmsnorm(x, w, 1e-6), *ops.sample(logits, **pk))

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = step()
        res = []
        for trial in range(2):
            if trial == 1:  # new inputs, same buffers
                q.copy_(torch.randn(q.shape, generator=gen).to(torch.bfloat16).to(dev))
                logits.copy_(torch.randn(logits.shape, generator=gen).to(dev))
            g.replay()
            torch.cuda.synchronize()
            eager = step()
            same = all(torch.equal(a, b) for a, b in zip(outs, eager))
            res.append((same, f"replay {trial}: graph outputs bitwise equal to eager: {same}"))
        return res
    C.run("graph", "decode + rmsnorm + sample captured in a CUDA graph", run)


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------

def _time(fn, iters: int = 20, warmup: int = 3) -> float:
    """Seconds per call of ``fn``, GPU time only: ``iters`` calls captured in one CUDA graph, replayed
    after warm-up (so Python launch overhead is not measured). Falls back to eager timing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        g.replay()
        torch.cuda.synchronize()
        a.record()
        g.replay()
        b.record()
    except Exception as e:  # noqa: BLE001
        print(f"    (graph timing failed: {e}; timing eagerly)")
        torch.cuda.synchronize()
        a.record()
        for _ in range(iters):
            fn()
        b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters * 1e-3  # seconds


def timing(dev, gen) -> None:
    print("\n== timing (CUDA events over a CUDA graph of 20 calls, after 3 warm-ups: GPU time only) ==")
    D, n_q, n_kv, bs = 128, 32, 8, 16
    for B, L, S in ((64, 4096, 512), (64, 4096, 4096), (8, 32768, 2048), (256, 2048, 512)):
        lens = [L] * B
        need = -(-L // bs)
        nb = B * need
        kc = torch.randn(nb, bs, n_kv, D, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        bt = torch.randperm(nb, device=dev).to(torch.int32).view(B, need)
        sl = torch.tensor(lens, dtype=torch.int32, device=dev)
        q = torch.randn(B, n_q, D, device=dev, dtype=torch.bfloat16)
        ms = -(-L // S)
        t = _time(lambda: ops.split_kv_decode(q, kc, vc, bt, sl, S, max_splits=ms))
        gb = 2 * B * L * n_kv * D * 2 / 1e9
        print(f"split_kv_decode B={B} L={L} S={S} n_q={n_q} n_kv={n_kv} D={D}: {t * 1e6:8.1f} us, "
              f"{gb / t:7.1f} GB/s of K/V")
        del kc, vc
    for T, n_q, n_kv in ((4096, 32, 8), (8192, 32, 8), (2048, 64, 8)):
        kc = torch.randn(T // bs, bs, n_kv, D, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        bt = torch.arange(T // bs, device=dev, dtype=torch.int32).view(1, -1)
        sl = torch.tensor([T], dtype=torch.int32, device=dev)
        q = torch.randn(T, n_q, D, device=dev, dtype=torch.bfloat16)
        qi = torch.zeros(T, dtype=torch.int32, device=dev)
        qp = torch.arange(T, dtype=torch.int32, device=dev)
        flops = 4 * n_q * D * T * (T + 1) / 2
        for var in ops.prefill_variants(D, q.device.index or 0):
            if var == "default":
                continue
            tv = _time(lambda: ops.paged_prefill(q, kc, vc, bt, sl, qi, qp, variant=var))
            print(f"paged_prefill[{var}] T={T} n_q={n_q} n_kv={n_kv} D={D}: {tv * 1e3:.3f} ms = "
                  f"{flops / tv / 1e12:.1f} TFLOP/s")
        t = _time(lambda: ops.paged_prefill(q, kc, vc, bt, sl, qi, qp))
        qd, kd, vd = q.transpose(0, 1)[None], kc.view(T, n_kv, D).transpose(0, 1)[None], vc.view(T, n_kv, D).transpose(0, 1)[None]
        try:
            ts = _time(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True))
            sdpa = f"; torch SDPA (dense, causal) {ts * 1e3:.3f} ms = {flops / ts / 1e12:.1f} TFLOP/s"
        except Exception as e:  # noqa: BLE001
            sdpa = f"; SDPA failed: {e}"
        print(f"paged_prefill T={T} n_q={n_q} n_kv={n_kv} D={D}: {t * 1e3:.3f} ms = {flops / t / 1e12:.1f} TFLOP/s{sdpa}")
    # sampling: B rows of a Qwen3 vocabulary
    for B in (1, 64, 256):
        logits = torch.randn(B, 151936, device=dev) * 3
        for label, sp in (("greedy", SamplingParams(temperature=0.0)),
                          ("T=1.0 (plain)", SamplingParams(temperature=1.0)),
                          ("T=1.0 (plain), logits x 8 / 3", SamplingParams(temperature=1.0)),
                          ("T=0.7 top_k=50 top_p=0.9", SamplingParams(temperature=0.7, top_k=50, top_p=0.9)),
                          ("T=1.0 top_p=0.95", SamplingParams(temperature=1.0, top_p=0.95)),
                          ("T=0.6 top_k=20 top_p=0.95 (Qwen3's suggestion)",
                           SamplingParams(temperature=0.6, top_k=20, top_p=0.95)),
                          ("T=1.0 top_p=0.95, logits x 30 / 3 (peaked)", SamplingParams(temperature=1.0, top_p=0.95))):
            pk = ops.pack_sampling_params([sp] * B, list(range(B)), dev)
            lg = logits * (8 / 3) if "x 8" in label else logits * 10 if "x 30" in label else logits   # wider
            t = _time(lambda: ops.sample(lg, **pk))
            print(f"sample B={B} V=151936 {label}: {t * 1e6:.1f} us")
    # resume-shaped: B sequences, 32 new tokens each over an 8192-token prefix
    B, new, L, n_q, n_kv = 16, 32, 8192, 32, 8
    need = L // bs
    kc = torch.randn(B * need, bs, n_kv, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    bt = torch.randperm(B * need, device=dev).to(torch.int32).view(B, need)
    sl = torch.full((B,), L, dtype=torch.int32, device=dev)
    qi = torch.arange(B, device=dev, dtype=torch.int32).repeat_interleave(new)
    qp = torch.arange(L - new, L, device=dev, dtype=torch.int32).repeat(B)
    q = torch.randn(B * new, n_q, D, device=dev, dtype=torch.bfloat16)
    t = _time(lambda: ops.paged_prefill(q, kc, vc, bt, sl, qi, qp))
    gb = 2 * B * L * n_kv * D * 2 / 1e9
    print(f"paged_prefill resume B={B} new={new} prefix={L}: {t * 1e6:.1f} us, {gb / t:.1f} GB/s of K/V, "
          f"{4 * n_q * D * B * new * L / t / 1e12:.1f} TFLOP/s")


# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# batch-invariant mode: the fixed-order GEMM and prefill rows through the split-KV kernel
# --------------------------------------------------------------------------------------

def linear_accuracy(fn, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, list[tuple[bool, str]]]:
    """``fn(x, w)`` (bf16 out) and ``fn(x, w, out_dtype=float32)``: the flash rule for both against the
    float64 product (torch's bf16 matmul is the low-precision run), and the bf16 output equal to the
    rounded fp32 one. Returns the fp32 output and the checks."""
    y = fn(x, w)
    y32 = fn(x, w, out_dtype=torch.float32)
    ref32 = x.double() @ w.double().t()
    refbf = torch.matmul(x, w.t())
    torch.cuda.synchronize()
    res = fa_rule("bf16 out", y, ref32, refbf) + fa_rule("fp32 out", y32, ref32, refbf)
    res += exact("bf16 out == round(fp32 out)", y, y32.to(torch.bfloat16))
    return y32, res


def check_gemm(C: Checks, dev, gen) -> None:
    """``ops.gemm``: the flash rule vs an fp32 product (torch's bf16 matmul is the low-precision run);
    row ``r`` bitwise equal alone (M = 1) and inside M rows; every tile bitwise equal to every other (the
    staged and wide kernels wherever they take M rows, launched twice: a launch must leave nothing behind). The
    "wide" shapes scale every element of x by a random power of two in [2^-12, 2^12], so that the terms of a
    sum differ in magnitude and any change of the order in which they are added changes bits."""
    shapes = [(1, 64, 48), (7, 96, 40), (16, 1024, 2048), (5, 2048, 1544), (33, 6144, 4096), (64, 4096, 4096),
              (40, 4096, 12288), (200, 4096, 4096), (300, 3072, 1024), (1000, 512, 1032), (70, 151936, 1024),
              (3, 151936, 4096), (1, 6144, 4096), (8, 4096, 12288), (12, 24576, 4096), (32, 6144, 4096),
              (3, 1000, 1032), (25, 2050, 3080), (4, 6144, 4096, "wide"), (29, 1024, 12288, "wide"),
              (48, 2050, 1024, "wide"), (100, 1000, 2048), (17, 4096, 4160)]
    for M, N, K, *kind in shapes:
        def run(M=M, N=N, K=K, wide=bool(kind)):
            x = (torch.randn(M, K, generator=gen) * 0.5)
            if wide:
                x = x * torch.exp2(torch.randint(-12, 13, (M, K), generator=gen).float())
            x = x.to(torch.bfloat16).to(dev)
            w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(torch.bfloat16).to(dev)
            y32, res = linear_accuracy(ops.gemm, x, w)
            rows = sorted({0, M // 2, M - 1})
            for r in rows:
                alone = ops.gemm(x[r:r + 1].clone(), w, out_dtype=torch.float32)
                res += exact(f"row {r} of M={M} == row alone", y32[r:r + 1], alone)
            print(f"    default kernel: {ops.gemm_choice(M, N, K)}")
            tiles = [*ops.GEMM_TILES, *(t for t, (rows, *_) in ops.GEMM_STAGED.items() if M <= rows),
                     *(t for t, (rows, *_) in ops.GEMM_WIDE.items() if M <= rows and K % 64 == 0)]
            for tile in tiles:   # split and staged tiles twice: the tickets must be reset by each launch
                for rep in range(1 if tile in ops.GEMM_TILES and not tile.startswith("split") else 2):
                    res += exact(f"tile {tile} == default (launch {rep})",
                                 ops.gemm(x, w, out_dtype=torch.float32, tile=tile), y32)
            for tile in tiles[len(ops.GEMM_TILES):]:   # and the staged and wide kernels' bf16 out
                res += exact(f"tile {tile} bf16 == round(fp32)", ops.gemm(x, w, tile=tile), y32.to(torch.bfloat16))
            for tile in (t for t in tiles if t in ops.GEMM_WIDE):   # no weights copied before the PDL wait, or one
                for pre in (0, 1, 8):
                    res += exact(f"tile {tile} pre={pre} == default", ops.gemm(x, w, out_dtype=torch.float32, tile=tile,
                                                                             pre=pre), y32)
            # a row's result does not depend on its neighbours: shuffle the rows and compare
            perm = torch.randperm(M, generator=gen).to(dev)
            res += exact("rows permuted", ops.gemm(x[perm].contiguous(), w, out_dtype=torch.float32), y32[perm])
            return res
        C.run("gemm", f"M={M} N={N} K={K}" + (" wide" if kind else ""), run)


def check_gemm_swiglu(C: Checks, dev, gen) -> None:
    """``ops.gemm(..., swiglu=True)``: bitwise ``silu_mul(gemm(x, w))`` on every wide tile that takes M rows (launched
    twice, and with no or one stage's weights copied before the PDL wait) and by the default choice, a row alone as
    inside M rows; I not a multiple of a tile's outputs; over 128 rows, the two launches. x scaled by 2^[-12, 12]
    as in the gemm section's "wide" shapes, so that a change of summation order would change bits."""
    for M, I, K in [(1, 3072, 1024), (5, 3072, 1024), (16, 12288, 4096), (29, 3072, 1024), (32, 12288, 4096),
                    (64, 3072, 1024), (64, 12288, 4096), (100, 1000, 2048), (128, 3072, 1024), (200, 3072, 1024)]:
        def run(M=M, I=I, K=K):
            x = torch.randn(M, K, generator=gen) * 0.5 * torch.exp2(torch.randint(-12, 13, (M, K), generator=gen).float())
            x = x.to(torch.bfloat16).to(dev)
            w = (torch.randn(2 * I, K, generator=gen) * K ** -0.5).to(torch.bfloat16).to(dev)
            ref = ops.silu_mul(ops.gemm(x, w))
            y = ops.gemm(x, w, swiglu=True)
            print(f"    default kernel: {ops.gemm_choice(M, 2 * I, K)}")
            res = exact("default == silu_mul(gemm)", y, ref)
            for r in sorted({0, M // 2, M - 1}):
                res += exact(f"row {r} alone", ops.gemm(x[r:r + 1].clone(), w, swiglu=True), ref[r:r + 1])
            for tile, (rows, *_) in ops.GEMM_WIDE.items():
                if M > rows:
                    continue
                for rep in range(2):
                    res += exact(f"tile {tile} (launch {rep})", ops.gemm(x, w, swiglu=True, tile=tile), ref)
                for pre in (0, 1, 8):
                    res += exact(f"tile {tile} pre={pre}", ops.gemm(x, w, swiglu=True, tile=tile, pre=pre), ref)
            return res
        C.run("gemm_swiglu", f"M={M} I={I} K={K}", run)


def check_invariant_attention(C: Checks, dev, gen) -> None:
    """Prefill tokens as split-KV rows (``row_seq``): bitwise the decode computation of their position."""
    for name, D, n_q, n_kv, bs, S in [("d128 gqa2 bs16 S=64", 128, 16, 8, 16, 64), ("d64 gqa4 bs5 S=7", 64, 8, 2, 5, 7),
                                      ("d32 gqa2 bs4 S=8", 32, 4, 2, 4, 8), ("d16 mha bs8 S=5", 16, 3, 3, 8, 5)]:
        def run(D=D, n_q=n_q, n_kv=n_kv, bs=bs, S=S):
            lens = [70, 9, 33]
            kc, vc, bt, sl = build_paged(lens, bs, n_kv, D, gen, dev)
            rows = [(b, p) for b, L in enumerate(lens) for p in range(max(0, L - 12), L)]
            T = len(rows)
            q = torch.randn(T, n_q, D, generator=gen).to(torch.bfloat16).to(dev)
            rseq = torch.tensor([b for b, _ in rows], dtype=torch.int32, device=dev)
            rlen = torch.tensor([p + 1 for _, p in rows], dtype=torch.int32, device=dev)
            ms = -(-max(lens) // S)
            out = ops.split_kv_decode(q, kc, vc, bt, rlen, S, D ** -0.5, max_splits=ms, row_seq=rseq)
            res = []
            # decode twin: each row alone with its sequence's table row, a different max_splits
            alone = torch.cat([ops.split_kv_decode(q[t:t + 1], kc, vc, bt[b:b + 1].contiguous(),
                                                   rlen[t:t + 1].contiguous(), S, D ** -0.5, max_splits=ms + 3)
                               for t, (b, _) in enumerate(rows)])
            res += exact("row_seq rows == decode rows", out, alone)
            qc = q.float().cpu()
            ref32 = ref_attn.invariant_attention(qc, kc.float().cpu(), vc.float().cpu(), bt.long().cpu(),
                                                 rseq.long().cpu(), rlen.long().cpu() - 1, S, D ** -0.5)
            refbf = torch.stack([dense_bf16(q[t:t + 1], gather_dev(kc, bt[b], 0, p + 1), gather_dev(vc, bt[b], 0, p + 1),
                                            torch.tensor([p], device=dev), D ** -0.5)[0] for t, (b, p) in enumerate(rows)])
            res += fa_rule("vs reference invariant_attention", out, ref32.float(), refbf)
            return res
        C.run("invariant", name, run)


def _rotate_bf16(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """rope.cu's rotation in torch, one rounding per product and per sum: k [..., n, D] at positions pos [...]."""
    half = k.shape[-1] // 2
    c, s_ = cos[pos.long()][..., None, :], sin[pos.long()][..., None, :]
    a, b = k[..., :half].float(), k[..., half:].float()
    return torch.cat([a * c - b * s_, b * c + a * s_], -1).to(torch.bfloat16)


def check_fused_rope(C: Checks, dev, gen) -> None:
    """Fused RoPE: pre-RoPE caches + tables == caches rotated beforehand, for both attention kernels."""
    from reference.rope import rope_cos_sin
    for name, D, n_q, n_kv, bs in [("d128 gqa4 bs16", 128, 32, 8, 16), ("d64 gqa2 bs5", 64, 8, 4, 5),
                                   ("d16 mha bs8", 16, 3, 3, 8)]:
        def run(D=D, n_q=n_q, n_kv=n_kv, bs=bs):
            lens = [300, 17, 1]
            kc0, vc, bt, sl = build_paged(lens, bs, n_kv, D, gen, dev)
            cos, sin = rope_cos_sin(torch.arange(512), D, 1_000_000.0)
            cos, sin = cos[:, :D // 2].contiguous().to(dev), sin[:, :D // 2].contiguous().to(dev)
            kc1 = kc0.clone()
            for b, L in enumerate(lens):
                pos = torch.arange(L, device=dev)
                pages, slots = bt[b].long()[pos // bs], pos % bs
                kc1[pages, slots] = _rotate_bf16(kc0[pages, slots], cos, sin, pos)
            res = []
            q = torch.randn(len(lens), n_q, D, generator=gen).to(torch.bfloat16).to(dev)
            for S in (7, 64):
                fused = ops.split_kv_decode(q, kc0, vc, bt, sl, S, rope=(cos, sin))
                res += exact(f"split-KV S={S} fused == rotated cache", fused, ops.split_kv_decode(q, kc1, vc, bt, sl, S))
            qi = torch.tensor([0] * 40 + [1] * 17 + [2], dtype=torch.int32, device=dev)
            qp = torch.tensor(list(range(260, 300)) + list(range(17)) + [0], dtype=torch.int32, device=dev)
            qq = torch.randn(len(qp), n_q, D, generator=gen).to(torch.bfloat16).to(dev)
            for v in ops.prefill_variants(D, qq.device.index or 0):   # every prefill kernel (the engine picks by grid size)
                fused = ops.paged_prefill(qq, kc0, vc, bt, sl, qi, qp, rope=(cos, sin), variant=v)
                res += exact(f"paged prefill [{v}] fused == rotated cache", fused,
                             ops.paged_prefill(qq, kc1, vc, bt, sl, qi, qp, variant=v))
            # qk_norm_rope(rotate_k=False) then this rotation == qk_norm_rope(rotate_k=True): the rotation
            # above is rope.cu's, bit for bit, so fused and unfused engines cache the same keys
            kx = torch.randn(len(qp), n_kv, D, generator=gen).to(torch.bfloat16).to(dev)
            w = (1 + 0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16).to(dev)
            k_on, k_off = kx.clone(), kx.clone()
            ops.qk_norm_rope(qq.clone(), k_on, w, w, cos, sin, qp, 1e-6)
            ops.qk_norm_rope(qq.clone(), k_off, w, w, cos, sin, qp, 1e-6, rotate_k=False)
            res += exact("qk_norm_rope(rotate_k=False) + rotation == rotate_k=True", _rotate_bf16(k_off, cos, sin, qp), k_on)
            return res
        C.run("fused_rope", name, run)

def skinny_inputs(M: int, N: int, K: int, gen, dev, w_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode GEMM's operands for the skinny kernels' checks: bf16 x [M, K] with row stride K + 8 (a
    strided view) and bf16 w [N, K] of entries ~ w_scale / sqrt(K), drawn from ``gen`` in that order."""
    xw = (torch.randn(M, K + 8, generator=gen) * 0.5).to(torch.bfloat16).to(dev)
    w = (torch.randn(N, K, generator=gen) * K ** -0.5 * w_scale).to(torch.bfloat16).to(dev)
    return xw[:, :K], w


def check_skinny(C: Checks, dev, gen) -> None:
    """``ops.skinny_gemm`` (default-mode GEMM, M <= 16): the flash rule vs a float64 product (torch's
    bf16 matmul is the low-precision run), bf16 out == rounded fp32 out, a strided x, two launches
    bitwise equal (and one without the L2 prefetch before the PDL wait), and rows independent of M (every
    M <= 16 takes the same per-element mma chain)."""
    shapes = [(1, 6144, 4096), (1, 4096, 12288), (4, 24576, 4096), (8, 1024, 3072), (9, 4096, 4096),
              (16, 6144, 1024), (1, 151936, 1024), (13, 40, 40), (2, 24, 8), (7, 100, 1544), (16, 17, 4104)]
    for M, N, K in shapes:
        def run(M=M, N=N, K=K):
            x, w = skinny_inputs(M, N, K, gen, dev)
            y32, res = linear_accuracy(ops.skinny_gemm, x, w)
            res += exact("second launch", ops.skinny_gemm(x, w, out_dtype=torch.float32), y32)
            res += exact("without the L2 prefetch", ops.skinny_gemm(x, w, out_dtype=torch.float32, prefetch=False), y32)
            r = M - 1
            res += exact(f"row {r} alone == row {r} of M={M}", ops.skinny_gemm(x[r:r + 1].contiguous(), w,
                                                                               out_dtype=torch.float32), y32[r:r + 1])
            ref32 = x.double() @ w.double().t()
            for wp in sorted({4, 8, 16} - {ops.skinny_warps(N, K)}):   # the CTA sizes not picked here
                res += fa_rule(f"{wp} warps", ops.skinny_gemm(x, w, warps=wp), ref32, torch.matmul(x, w.t()))
            print(f"    warps per CTA: {ops.skinny_warps(N, K)}")
            return res
        C.run("skinny", f"M={M} N={N} K={K}", run)


def check_skinny_epilogues(C: Checks, dev, gen) -> None:
    """The skinny GEMM's SwiGLU epilogue: ``skinny_swiglu`` bitwise equal to ``silu_mul(skinny_gemm)``
    (strided x, both M tiles, a width that is not a multiple of 16 CTAs' worth), and the flash rule
    against a float64 run of the whole step (torch's bf16 GEMM + silu * up is the low-precision run)."""
    for M, I, K in ((1, 12288, 4096), (8, 3072, 1024), (5, 24, 40), (16, 6144, 4096), (9, 1536, 2048)):
        def run_swiglu(M=M, I=I, K=K):
            x, w = skinny_inputs(M, 2 * I, K, gen, dev, w_scale=2.0)
            fused = ops.skinny_swiglu(x, w)
            unfused = ops.silu_mul(ops.skinny_gemm(x, w))
            no_prefetch = ops.skinny_swiglu(x, w, prefetch=False)
            torch.cuda.synchronize()
            gu = x.double() @ w.double().t()
            ref32 = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
            gbf = torch.matmul(x, w.t())
            refbf = torch.nn.functional.silu(gbf[:, :I]) * gbf[:, I:]
            return exact("fused == silu_mul(skinny_gemm)", fused, unfused) + exact("without the L2 prefetch", no_prefetch, fused) \
                + fa_rule("vs float64", fused, ref32, refbf)
        C.run("epilogue", f"swiglu M={M} I={I} K={K}", run_swiglu)


def check_skinny_staged(C: Checks, dev, gen) -> None:
    """``ops.skinny_staged`` (the staged decode GEMM, M <= 8): the flash rule vs a float64 product for bf16
    and fp32 out, bf16 out == rounded fp32 out, a strided x, and the bits of ``skinny_gemm(warps=4)`` (the
    same sums in the same order) for every (chunk, stages, lanes, CTAs per SM) configuration, for a second
    launch (the tile counters reset), with no stage before the PDL wait, with the weight copies without an L2 hint
    and for a row alone; the SwiGLU
    epilogue bitwise ``skinny_swiglu(warps=4)`` and against a float64 run of the whole step. Shapes with a
    ragged last chunk, a partial last tile, fewer tiles than CTAs."""
    shapes = [(1, 6144, 4096), (8, 4096, 12288), (1, 24576, 4096), (5, 151936, 1024), (3, 40, 40), (2, 24, 8),
              (7, 100, 1544), (8, 17, 4104), (1, 4096, 4096), (4, 1024, 3072)]
    configs = [(kc, S, pl, c) for kc, S, pl in ops.SKINNY_STAGED_CONFIGS for c in (1, 2, 3)
               if c * ops.skinny_staged_smem(kc, S) <= 220 * 1024]
    for M, N, K in shapes:
        def run(M=M, N=N, K=K):
            x, w = skinny_inputs(M, N, K, gen, dev)
            y32, res = linear_accuracy(ops.skinny_staged, x, w)
            res += exact("== skinny_gemm(warps=4)", y32, ops.skinny_gemm(x, w, out_dtype=torch.float32, warps=4))
            res += exact("second launch", ops.skinny_staged(x, w, out_dtype=torch.float32), y32)
            res += exact("no stage before the PDL wait", ops.skinny_staged(x, w, out_dtype=torch.float32, pre=0), y32)
            res += exact("weight copies without an L2 hint", ops.skinny_staged(x, w, out_dtype=torch.float32,
                                                                         evict_first=False), y32)
            r = M - 1
            res += exact(f"row {r} alone == row {r} of M={M}", ops.skinny_staged(x[r:r + 1].contiguous(), w,
                                                                                 out_dtype=torch.float32), y32[r:r + 1])
            for kc, S, pl, Cs in configs:
                kw = dict(out_dtype=torch.float32, kc=kc, stages=S, lanes=pl, ctas_per_sm=Cs)
                res += exact(f"kc {kc}, {S} stages, {pl} lanes, {Cs} CTAs/SM", ops.skinny_staged(x, w, **kw), y32)
            return res
        C.run("staged", f"M={M} N={N} K={K}", run)
    for M, I, K in ((1, 12288, 4096), (8, 3072, 1024), (5, 24, 40), (3, 1536, 2056)):
        def run_swiglu(M=M, I=I, K=K):
            x, w = skinny_inputs(M, 2 * I, K, gen, dev, w_scale=2.0)
            fused = ops.skinny_staged(x, w, swiglu=True)
            again = ops.skinny_staged(x, w, swiglu=True, pre=0, evict_first=False)
            other = ops.skinny_staged(x, w, swiglu=True, kc=512, stages=4, ctas_per_sm=2)
            torch.cuda.synchronize()
            gu = x.double() @ w.double().t()
            ref32 = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
            gbf = torch.matmul(x, w.t())
            refbf = torch.nn.functional.silu(gbf[:, :I]) * gbf[:, I:]
            return fa_rule("vs float64", fused, ref32, refbf) + exact("== skinny_swiglu(warps=4)", fused,
                                                                       ops.skinny_swiglu(x, w, warps=4)) \
                + exact("second launch, no stage before the wait, no L2 hint", again, fused) \
                + exact("kc 512, 4 stages, 2 CTAs/SM", other, fused)
        C.run("staged", f"swiglu M={M} I={I} K={K}", run_swiglu)


def check_skinny_staged_wide(C: Checks, dev, gen) -> None:
    """``ops.skinny_staged`` at 9-32 rows (the wide kernels, ``ops.SKINNY_STAGED_WIDE``): the flash rule vs a
    float64 product for bf16 and fp32 out, bf16 out == rounded fp32 out, a strided x; every built configuration
    (chunk, stages, lanes, tiles a stage) at 1-3 CTAs a multiprocessor where it fits, a second launch, no stage
    before the PDL wait and copies without an L2 hint bitwise equal; the bits of ``skinny_gemm(warps=4)`` up to 16
    rows, and of the 8-row staged kernel row by row (every row alone, and in blocks of 8) at any M -- a row's sum
    is the same chain whatever the row width; the SwiGLU epilogue bitwise ``silu_mul`` of the plain kernel's
    bf16 output (which is ``skinny_swiglu(warps=4)``'s rule) and against a float64 run of the whole step. Shapes
    with a ragged last chunk, partial last tiles and units, fewer units than CTAs, an odd tile count with two
    tiles a stage."""
    shapes = [(16, 6144, 4096), (9, 4096, 12288), (32, 6144, 4096), (17, 24576, 4096), (32, 4096, 12288),
              (24, 151936, 1024), (13, 40, 40), (32, 24, 8), (31, 100, 1544), (20, 17, 4104), (32, 48, 520)]
    for M, N, K in shapes:
        rows = ops.skinny_staged_rows(M)
        configs = [(kc, S, pl, tp, c) for kc, S, pl, tp in ops.SKINNY_STAGED_WIDE[rows] for c in (1, 2, 3)
                   if c * (ops.skinny_staged_smem(kc, S, tp) + ops.skinny_staged_static_smem(rows, tp) + 1024)
                   <= 228 * 1024]
        kc0, S0, pl0, tp0 = ops.SKINNY_STAGED_WIDE[rows][0]
        base = dict(kc=kc0, stages=S0, lanes=pl0, tp=tp0)

        def run(M=M, N=N, K=K, configs=configs, base=base):
            x, w = skinny_inputs(M, N, K, gen, dev)
            y32, res = linear_accuracy(lambda a, b, **kw: ops.skinny_staged(a, b, **base, **kw), x, w)
            if M <= 16:
                res += exact("== skinny_gemm(warps=4)", y32, ops.skinny_gemm(x, w, out_dtype=torch.float32, warps=4))
            by8 = torch.cat([ops.skinny_staged(x[r:r + 8], w, out_dtype=torch.float32) for r in range(0, M, 8)])
            res += exact("== the 8-row staged kernel over blocks of 8 rows", y32, by8)
            alone = torch.cat([ops.skinny_staged(x[r:r + 1], w, out_dtype=torch.float32) for r in (0, M - 1)])
            res += exact(f"rows 0 and {M - 1} alone == theirs of M={M}", alone, y32[[0, M - 1]])
            res += exact("second launch", ops.skinny_staged(x, w, out_dtype=torch.float32, **base), y32)
            res += exact("no stage before the PDL wait, no L2 hint",
                         ops.skinny_staged(x, w, out_dtype=torch.float32, pre=0, evict_first=False, **base), y32)
            for kc, S, pl, tp, Cs in configs:
                kw = dict(out_dtype=torch.float32, kc=kc, stages=S, lanes=pl, tp=tp, ctas_per_sm=Cs)
                res += exact(f"kc {kc}, {S} stages, {pl} lanes, {tp} tiles a stage, {Cs} CTAs/SM",
                             ops.skinny_staged(x, w, **kw), y32)
            return res
        C.run("staged_wide", f"M={M} N={N} K={K}", run)
    for M, I, K in ((32, 12288, 4096), (16, 3072, 1024), (21, 24, 40), (9, 1544, 2056), (32, 8, 64)):
        rows = ops.skinny_staged_rows(M)

        def run_swiglu(M=M, I=I, K=K, rows=rows):
            x, w = skinny_inputs(M, 2 * I, K, gen, dev, w_scale=2.0)
            outs = [ops.skinny_staged(x, w, swiglu=True, kc=kc, stages=S, lanes=pl, tp=tp)
                    for kc, S, pl, tp in ops.SKINNY_STAGED_WIDE[rows]]
            kc0, S0, pl0, tp0 = ops.SKINNY_STAGED_WIDE[rows][0]
            plain = ops.skinny_staged(x, w, kc=kc0, stages=S0, lanes=pl0, tp=tp0)
            torch.cuda.synchronize()
            gu = x.double() @ w.double().t()
            ref32 = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
            gbf = torch.matmul(x, w.t())
            refbf = torch.nn.functional.silu(gbf[:, :I]) * gbf[:, I:]
            fused = outs[0]
            res = fa_rule("vs float64", fused, ref32, refbf)
            res += exact("== silu_mul(the plain kernel)", fused, ops.silu_mul(plain))
            if M <= 16:
                res += exact("== skinny_swiglu(warps=4)", fused, ops.skinny_swiglu(x, w, warps=4))
            for (kc, S, _pl, tp), o in zip(ops.SKINNY_STAGED_WIDE[rows][1:], outs[1:]):
                res += exact(f"kc {kc}, {S} stages, {tp} tiles a stage", o, fused)
            return res
        C.run("staged_wide", f"swiglu M={M} I={I} K={K}", run_swiglu)


def check_skinny_cluster(C: Checks, dev, gen) -> None:
    """``ops.skinny_cluster`` (the cluster kernel, 17-64 rows): the flash rule vs a float64 product for bf16 and fp32
    out, bf16 out == rounded fp32 out, a strided x; the bits of the 8-row staged kernel row by row (blocks of 8) for
    every built configuration (and warp count), a second launch, no stage before the PDL wait and copies without an L2 hint; the
    SwiGLU epilogue bitwise ``silu_mul`` of the plain output. (K a multiple of 64: the tensor maps' blocks.) Shapes
    with a ragged last chunk, partial last tiles
    and units, more units than the clusters hold at once (a CTA with more units than others: idle stages), fewer
    units than a cluster's CTAs, and rows not a multiple of the cluster."""
    shapes = [(64, 4096, 1024), (32, 1024, 2048), (48, 1024, 3072), (17, 6144, 4096), (64, 4096, 4096),
              (33, 151936, 1024), (64, 40, 64), (20, 24, 128), (63, 100, 1600), (24, 17, 4160), (64, 48, 576)]
    for M, N, K in shapes:
        def run(M=M, N=N, K=K):
            x, w = skinny_inputs(M, N, K, gen, dev)
            kc0, S0, tp0, c0 = ops.SKINNY_CLUSTER_CONFIGS[0]
            base = dict(kc=kc0, stages=S0, tp=tp0, cluster=c0)
            y32, res = linear_accuracy(lambda a, b, **kw: ops.skinny_cluster(a, b, **base, **kw), x, w)
            by8 = torch.cat([ops.skinny_staged(x[r:r + 8], w, out_dtype=torch.float32) for r in range(0, M, 8)])
            res += exact("== the 8-row staged kernel over blocks of 8 rows", y32, by8)
            res += exact("second launch", ops.skinny_cluster(x, w, out_dtype=torch.float32, **base), y32)
            res += exact("no stage before the PDL wait, no L2 hint",
                         ops.skinny_cluster(x, w, out_dtype=torch.float32, pre=0, evict_first=False, **base), y32)
            for kc, S, tp, c in ops.SKINNY_CLUSTER_CONFIGS[1:]:
                res += exact(f"kc {kc}, {S} stages, {tp} tiles a unit, clusters of {c}",
                             ops.skinny_cluster(x, w, out_dtype=torch.float32, kc=kc, stages=S, tp=tp, cluster=c), y32)
            for kc, S, tp, c in ops.SKINNY_CLUSTER_W8:
                res += exact(f"kc {kc}, {S} stages, {tp} tiles a unit, clusters of {c}, eight consumer warps",
                             ops.skinny_cluster(x, w, out_dtype=torch.float32, kc=kc, stages=S, tp=tp, cluster=c,
                                                warps=8), y32)
            return res
        C.run("cluster", f"M={M} N={N} K={K}", run)
    for M, I, K in ((64, 3072, 1024), (32, 12288, 4096), (21, 24, 64), (40, 1544, 2112)):
        def run_swiglu(M=M, I=I, K=K):
            x, w = skinny_inputs(M, 2 * I, K, gen, dev, w_scale=2.0)
            outs = [ops.skinny_cluster(x, w, swiglu=True, kc=kc, stages=S, tp=tp, cluster=c)
                    for kc, S, tp, c in ops.SKINNY_CLUSTER_CONFIGS]
            outs += [ops.skinny_cluster(x, w, swiglu=True, kc=kc, stages=S, tp=tp, cluster=c, warps=8)
                     for kc, S, tp, c in ops.SKINNY_CLUSTER_W8]
            plain = ops.skinny_cluster(x, w)
            torch.cuda.synchronize()
            gu = x.double() @ w.double().t()
            ref32 = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
            gbf = torch.matmul(x, w.t())
            refbf = torch.nn.functional.silu(gbf[:, :I]) * gbf[:, I:]
            res = fa_rule("vs float64", outs[0], ref32, refbf)
            res += exact("== silu_mul(the plain kernel)", outs[0], ops.silu_mul(plain))
            cfgs = list(ops.SKINNY_CLUSTER_CONFIGS[1:]) + [c + ("eight warps",) for c in ops.SKINNY_CLUSTER_W8]
            for cfg, o in zip(cfgs, outs[1:]):
                res += exact(f"configuration {cfg}", o, outs[0])
            return res
        C.run("cluster", f"swiglu M={M} I={I} K={K}", run_swiglu)


def wg_configs(M: int, K: int) -> list[tuple[int, int, int]]:
    """The (tiles a unit, CTAs splitting K, stages) of every built warpgroup-kernel configuration for ``M`` rows
    that takes this ``K``."""
    nx = ops.skinny_wg_rows(M)
    return [(wt, kp, S) for kc, S, n, wt, kp in ops.SKINNY_WG_CONFIGS
            if n == nx and K % (64 * kp) == 0 and (kp == 1 or (K // kp) % kc == 0)]


def wg_default(M: int, wt: int, kp: int, S: int) -> bool:
    """Whether ``S`` stages is the default configuration's for ``M`` rows, ``wt`` and ``kp`` (the first listed)."""
    return ops.skinny_wg_config(M, wt, kp)[1] == S


def check_skinny_wg(C: Checks, dev, gen) -> None:
    """``ops.skinny_wg`` (the warpgroup kernel, 17-64 rows): for every built configuration that takes the shape,
    the flash rule vs a float64 product for bf16 and fp32 out and bf16 out == rounded fp32 out; the same bits on a
    second launch, with no stage before the PDL wait and copies without an L2 hint, and with the split-K fold
    spread over the cluster (``spread=True``, where ``ops.skinny_wg_spreads``; bf16 and fp32); a configuration of
    other stages than the default's (``stages=4``) bitwise the default's; the SwiGLU epilogue bitwise ``silu_mul``
    of the plain output of the same configuration, and the flash rule for it. Shapes with a
    ragged last chunk (K % 128 != 0), partial last units, more units than the grid holds, fewer output columns
    than a unit, a strided x (``skinny_inputs``) and the qwen3 shapes."""
    shapes = [(32, 4096, 1024), (17, 1000, 2048), (64, 6144, 4096), (33, 4096, 4096), (50, 151936, 1024),
              (64, 40, 1024), (24, 100, 1600), (64, 1024, 3072), (48, 4096, 12288)]
    for M, N, K in shapes:
        def run(M=M, N=N, K=K):
            x, w = skinny_inputs(M, N, K, gen, dev)  # (x strided)
            res = []
            for wt, kp, S in wg_configs(M, K):
                cfg, tag = dict(wt=wt, kp=kp, stages=S), f"wt {wt} kp {kp} s {S}"
                y32, r = linear_accuracy(lambda a, b, **kw: ops.skinny_wg(a, b, **cfg, **kw), x, w)
                res += [(ok, f"{tag}: {d}") for ok, d in r]
                res += exact(f"{tag}: second launch", ops.skinny_wg(x, w, out_dtype=torch.float32, **cfg), y32)
                res += exact(f"{tag}: no stage before the PDL wait, no L2 hint",
                             ops.skinny_wg(x, w, out_dtype=torch.float32, pre=0, evict_first=False, **cfg), y32)
                if not wg_default(M, wt, kp, S):
                    res += exact(f"{tag}: == the default stages", y32,
                                 ops.skinny_wg(x, w, out_dtype=torch.float32, wt=wt, kp=kp))
                if ops.skinny_wg_spreads(ops.skinny_wg_rows(M), wt, kp):
                    res += exact(f"{tag}: the spread fold (fp32)",
                                 ops.skinny_wg(x, w, out_dtype=torch.float32, spread=True, **cfg), y32)
                    res += exact(f"{tag}: the spread fold (bf16)", ops.skinny_wg(x, w, spread=True, **cfg),
                                 ops.skinny_wg(x, w, **cfg))
            return res
        C.run("wg", f"M={M} N={N} K={K}", run)
    for M, I, K in ((64, 3072, 1024), (32, 12288, 4096), (21, 24, 1024), (40, 1544, 2048)):
        def run_swiglu(M=M, I=I, K=K):
            x, w = skinny_inputs(M, 2 * I, K, gen, dev, w_scale=2.0)
            gu = x.double() @ w.double().t()
            ref32 = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
            gbf = torch.matmul(x, w.t())
            refbf = torch.nn.functional.silu(gbf[:, :I]) * gbf[:, I:]
            res = []
            for wt, kp, S in wg_configs(M, K):
                tag = f"wt {wt} kp {kp} s {S}"
                out = ops.skinny_wg(x, w, swiglu=True, wt=wt, kp=kp, stages=S)
                plain = ops.skinny_wg(x, w, wt=wt, kp=kp, stages=S)
                torch.cuda.synchronize()
                res += [(ok, f"{tag}: {d}") for ok, d in fa_rule("vs float64", out, ref32, refbf)]
                res += exact(f"{tag}: == silu_mul(the plain kernel)", out, ops.silu_mul(plain))
                if ops.skinny_wg_spreads(ops.skinny_wg_rows(M), wt, kp):
                    res += exact(f"{tag}: the spread fold", ops.skinny_wg(x, w, swiglu=True, wt=wt, kp=kp, stages=S,
                                                                         spread=True), out)
            return res
        C.run("wg", f"swiglu M={M} I={I} K={K}", run_swiglu)

def check_skinny_wg_norm(C: Checks, dev, gen) -> None:
    """The add_rmsnorm folded into the warpgroup GEMMs around it (``ops.skinny_wg(residual=...)`` and ``norm=``), at
    qwen3-0.6b's and qwen3-8b's o_proj -> gate/up and down -> qkv shapes and a ragged one, for every configuration
    the folded kernels are built for. The residual epilogue: the stream bitwise that of the plain kernel of the same
    configuration followed by ``add_rmsnorm``, xw bitwise ``bf16(stream * weight)``, ssq's parts the float64 sums of
    squares of the new rows' 64-column blocks to a relative 1e-5 (float32 sums of at most 64 terms). The normed
    prologue (plain and SwiGLU): the flash rule against the float64 product of the float64 norm, the low-precision
    run being ``add_rmsnorm``'s output times the plain kernel of the same configuration (its bitwise share printed),
    and the same bits on a second launch. Both with the split-K fold spread over the cluster (``spread=True``) where
    it can be: every output bitwise the gathered fold's; and for every built stage count (``stages=4``), whose
    outputs must be the default's bit for bit."""
    eps = 1e-6
    cases = [(32, 2048, 1024, 2 * 3072, True), (32, 3072, 1024, 4096, False),   # qwen3-0.6b
             (64, 4096, 4096, 6144, False), (17, 12288, 4096, 2 * 12288, True),   # qwen3-8b
             (40, 1024, 1536, 2 * 520, True)]                                    # ragged: 40 rows, 24 units
    for M, K0, H, N1, swiglu in cases:
        def run(M=M, K0=K0, H=H, N1=N1, swiglu=swiglu):
            x, w0 = skinny_inputs(M, H, K0, gen, dev)
            x = x.contiguous()
            res0 = (torch.randn(M, H, generator=gen) * 2).to(torch.bfloat16).to(dev)
            nw = (1 + 0.1 * torch.randn(H, generator=gen)).to(torch.bfloat16).to(dev)
            w1 = (torch.randn(N1, H, generator=gen) * H ** -0.5).to(torch.bfloat16).to(dev)
            out = []
            for wt0, kp0, s0 in wg_configs(M, K0):
                if wt0 != 1 or not ops.skinny_wg_fold_ok(M, kp0, s0):
                    continue
                ref_res = res0.clone()
                h = ops.add_rmsnorm(ops.skinny_wg(x, w0, kp=kp0), ref_res, nw, eps)   # the two launches
                res, ssq = res0.clone(), ops.skinny_wg_ssq(H, x)
                xw = ops.skinny_wg(x, w0, kp=kp0, residual=(res, ssq, nw), stages=s0)
                torch.cuda.synchronize()
                out += [(ok, f"kp {kp0} s {s0}: stream {d}") for ok, d in exact("== plain + add_rmsnorm", res, ref_res)]
                out += [(ok, f"kp {kp0} s {s0}: xw {d}") for ok, d in exact("== bf16(stream * weight)", xw, ref_res * nw)]
                if ops.skinny_wg_spreads(ops.skinny_wg_rows(M), 1, kp0):   # the spread fold: the same three outputs
                    sres, sssq = res0.clone(), ops.skinny_wg_ssq(H, x)
                    sxw = ops.skinny_wg(x, w0, kp=kp0, residual=(sres, sssq, nw), spread=True, stages=s0)
                    for what, a, b in (("stream", sres, res), ("ssq", sssq[:, :M], ssq[:, :M]), ("xw", sxw, xw)):
                        out += [(ok, f"kp {kp0} s {s0}: spread {what} {d}") for ok, d in exact("== gathered", a, b)]
                sq = ref_res.double().pow(2)
                want = torch.stack([sq[:, u * 64:(u + 1) * 64].sum(1) for u in range(ssq.shape[0])])   # [units, M]
                rel = float(((ssq[:, :M].double() - want).abs() / want.clamp_min(1e-30)).max())
                print(f"    kp {kp0} s {s0}: ssq max relative error {rel:.2e}")
                out.append((rel <= 1e-5, f"kp {kp0} s {s0}: ssq max relative error {rel:.2e} (<= 1e-5)"))
                r64 = ref_res.double()
                g64 = (r64 / torch.sqrt(r64.pow(2).mean(1, keepdim=True) + eps) * nw.double()) @ w1.double().t()
                ref32 = g64
                if swiglu:
                    ref32 = torch.nn.functional.silu(g64[:, :N1 // 2]) * g64[:, N1 // 2:]
                for wt1, kp1, s1 in wg_configs(M, H):
                    if wt1 != 1 or not ops.skinny_wg_fold_ok(M, kp1, s1):
                        continue
                    got = ops.skinny_wg(xw, w1, swiglu=swiglu, kp=kp1, norm=(ssq, eps), stages=s1)
                    again = ops.skinny_wg(xw, w1, swiglu=swiglu, kp=kp1, norm=(ssq, eps), stages=s1)
                    low = ops.skinny_wg(h, w1, swiglu=swiglu, kp=kp1)
                    torch.cuda.synchronize()
                    tag = f"kp {kp0} s {s0} -> kp {kp1} s {s1}{' swiglu' if swiglu else ''}"
                    if not wg_default(M, 1, kp1, s1):
                        out += exact(f"{tag}: == the default stages", got,
                                     ops.skinny_wg(xw, w1, swiglu=swiglu, kp=kp1, norm=(ssq, eps)))
                    out += [(ok, f"{tag}: {d}") for ok, d in fa_rule("normed vs float64", got, ref32, low)]
                    print(f"    {tag}: {bf16_agreement(got, low)} (add_rmsnorm + the plain kernel)")
                    out += [(ok, f"{tag}: {d}") for ok, d in exact("second launch", again, got)]
                    if ops.skinny_wg_spreads(ops.skinny_wg_rows(M), 1, kp1):
                        spread = ops.skinny_wg(xw, w1, swiglu=swiglu, kp=kp1, norm=(ssq, eps), spread=True, stages=s1)
                        out += [(ok, f"{tag}: {d}") for ok, d in exact("the spread fold", spread, got)]
            return out
        C.run("wg-norm", f"M={M} K0={K0} H={H} N1={N1}{' swiglu' if swiglu else ''}", run)


def rope_tables(D: int, max_pos: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """The runner's fp32 RoPE tables (theta 1e6): cos, sin ``[max_pos, D/2]`` on ``dev``."""
    cos, sin = ref_model.rope_cos_sin(torch.arange(max_pos), D, 1e6)
    return cos[:, : D // 2].contiguous().to(dev), sin[:, : D // 2].contiguous().to(dev)


def qkv_views(buf: torch.Tensor, n_q: int, n_kv: int, D: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[T, heads, D]`` views of a qkv GEMM's output rows ``buf [T, (n_q + 2 n_kv) D]``."""
    T = buf.shape[0]
    return (buf[:, : n_q * D].view(T, n_q, D), buf[:, n_q * D:(n_q + n_kv) * D].view(T, n_kv, D),
            buf[:, (n_q + n_kv) * D:].view(T, n_kv, D))


def decode_positions(lens: list[int], bt: torch.Tensor, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's int32 positions and slots (CPU) for rows of ``lens`` keys over the host block table ``bt``:
    each row's new key is its last (position length - 1, at the table's slot of it); a row of length 0 is padding
    (position 0, slot -1)."""
    pos = torch.tensor([max(x - 1, 0) for x in lens], dtype=torch.int32)
    slots = torch.tensor([int(bt[b, (x - 1) // bs]) * bs + (x - 1) % bs if x > 0 else -1 for b, x in enumerate(lens)],
                         dtype=torch.int32)
    return pos, slots


def check_fused_decode(C: Checks, dev, gen) -> None:
    """The two launch fusions of a decode layer. (1) ``qk_norm_rope(store=...)``: q, k and both caches
    bitwise those of ``qk_norm_rope`` then ``store_kvcache`` (strided k/v, -1 slots, NaN pages).
    (2) ``split_kv_decode`` (one launch, last CTA folds) bitwise equal to partials + reduce, twice in a
    row (the tickets reset), with a zero-length row (zeros), one-split rows and many-split rows."""
    def run_store():
        res = []
        for T, n_q, n_kv, D, bs, rotate in ((29, 32, 8, 128, 16, True), (5, 8, 2, 64, 5, True), (7, 4, 4, 32, 8, False)):
            nb, max_pos, eps = 8, 4096, 1e-6
            cos_t, sin_t = rope_tables(D, max_pos, dev)
            width = (n_q + 2 * n_kv) * D
            qkv = (torch.randn(T, width, generator=gen) * 2).to(torch.bfloat16).to(dev)
            pos = torch.randint(0, max_pos, (T,), generator=gen).to(torch.int32).to(dev)
            slots = torch.randperm(nb * bs, generator=gen)[:T].to(torch.int32)
            slots[T // 2] = -1
            slots = slots.to(dev)
            qw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
            kw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
            outs = []
            for fused in (False, True):
                buf = qkv.clone()
                q, k, v = qkv_views(buf, n_q, n_kv, D)
                kc = torch.full((nb, bs, n_kv, D), float("nan"), dtype=torch.bfloat16, device=dev)
                vc = kc.clone()
                if fused:
                    ops.qk_norm_rope(q, k, qw, kw, cos_t, sin_t, pos, eps, rotate_k=rotate, store=(v, kc, vc, slots))
                else:
                    ops.qk_norm_rope(q, k, qw, kw, cos_t, sin_t, pos, eps, rotate_k=rotate)
                    ops.store_kvcache(k, v, kc, vc, slots)
                outs.append((buf, kc, vc))
            tag = f"T={T} D={D} bs={bs} rotate_k={rotate}"
            res += exact(f"{tag} q/k/v buffer", outs[1][0], outs[0][0])
            res += exact(f"{tag} k_cache (NaN pages kept)", outs[1][1], outs[0][1])
            res += exact(f"{tag} v_cache", outs[1][2], outs[0][2])
        return res

    def run_splitkv():
        res = []
        lens = [1, 15, 300, 17, 4097, 64]
        for D, n_q, n_kv, bs in ((128, 32, 8, 16), (128, 8, 2, 5), (64, 8, 2, 5), (16, 3, 3, 8)):
            kc, vc, bt, sl = build_paged(lens, bs, n_kv, D, gen, dev)
            sl0 = sl.clone()
            sl0[1] = 0                                            # a padding row of a decode graph
            q = (torch.randn(len(lens), n_q, D, generator=gen)).to(torch.bfloat16).to(dev)
            for S in (16, 64, 1000, 5000):
                for lens_t, tag in ((sl, "lens"), (sl0, "lens with a 0")):
                    two = ops.split_kv_decode(q, kc, vc, bt, lens_t, S, fused=False)
                    one = ops.split_kv_decode(q, kc, vc, bt, lens_t, S, fused=True)
                    again = ops.split_kv_decode(q, kc, vc, bt, lens_t, S, fused=True)
                    torch.cuda.synchronize()
                    res += exact(f"D={D} S={S} {tag}: fused == partials+reduce", one, two)
                    res += exact(f"D={D} S={S} {tag}: second fused launch", again, one)
                    if tag != "lens":
                        z = bool((one[1].float() == 0).all())
                        res.append((z, f"D={D} S={S}: zero-length row is zeros: {z}"))
            # None: one split over the whole table
            res += exact(f"D={D} split None: fused == partials+reduce", ops.split_kv_decode(q, kc, vc, bt, sl, None, fused=True),
                         ops.split_kv_decode(q, kc, vc, bt, sl, None, fused=False))
        return res

    C.run("fused", "qk_norm_rope + KV store", run_store)
    C.run("fused", "split_kv_decode one launch", run_splitkv)


def check_qk_attention(C: Checks, dev, gen) -> None:
    """``split_kv_decode(norm_rope=...)`` (``split_kv_qk_partials``: qk_norm_rope, its KV store and the decode
    attention in one launch) bitwise equal to ``qk_norm_rope(store=...)`` then ``split_kv_decode``: the
    output and both caches, the qkv buffer left raw; GQA groups of 1-16 (two CTAs a group at 16), block
    sizes 16 and 5, one to many splits, one launch and partials + reduce, twice in a row (the tickets
    reset). Rows: decode rows (position = length - 1 at its slot), a padding row (length 0, slot -1), and
    two rows outside a decode step's shape that take the kernel's other paths: the slot written is not the
    table's slot of the last position (that row is then read from the cache), and a position before the
    last key (no new key in the attention; the store by the split holding the position)."""
    def run():
        res = []
        eps, max_pos = 1e-6, 8192
        long_lens = [300, 1, 15, 4097, 64, 0, 129, 50]
        short_lens = [300, 1, 15, 1000, 64, 0, 129, 50]      # a 1024-key graph's rows: 2-8 splits, the cluster fold
        for n_q, n_kv, D, bs in ((32, 8, 128, 16), (16, 8, 128, 16), (64, 4, 128, 16), (8, 2, 64, 5), (3, 3, 16, 8),
                                 (8, 8, 32, 16)):
            cos_t, sin_t = rope_tables(D, max_pos, dev)
            for B, lens, splits in ((8, long_lens, ((16, None), (64, None), (128, None), (1000, None), (None, None))),
                                    (20, long_lens, ((64, None), (1000, None))),
                                    (8, short_lens, ((128, 8), (256, 4), (512, 2), (1024, 1)))):
                L = (lens * 3)[:B]
                kc0, vc0, bt, sl = build_paged(L, bs, n_kv, D, gen, dev, extra_pages=8)
                btc = bt.cpu()
                pos, slots = decode_positions(L, btc, bs)
                spare = kc0.shape[0] - 1                  # an extra page (no sequence owns it, NaN)
                if any(int(r) == spare for r in btc.flatten()):
                    spare = next(pg for pg in range(kc0.shape[0]) if pg not in set(btc.flatten().tolist()))
                slots[6] = spare * bs                     # row 6: the slot written is not the table's
                pos[7] = L[7] - 3                         # row 7: a position before its last key,
                slots[7] = spare * bs + 1                 # written to the spare page
                pos, slots = pos.to(dev), slots.to(dev)
                width = (n_q + 2 * n_kv) * D
                qkv = (torch.randn(B, width, generator=gen) * 2).to(torch.bfloat16).to(dev)
                qw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
                kw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
                for S, ms in splits:
                    for fused, cluster in (((True, True), (True, False), (False, True)) if S is not None
                                           else ((True, True),)):
                        ops.DECODE_CLUSTER = cluster
                        outs = []
                        for one in (False, True):
                            buf = qkv.clone()
                            q, k, v = qkv_views(buf, n_q, n_kv, D)
                            kc, vc = kc0.clone(), vc0.clone()
                            if one:
                                nr = (k, v, qw, kw, cos_t, sin_t, pos, slots, eps)
                                o = ops.split_kv_decode(q, kc, vc, bt, sl, S, fused=fused, norm_rope=nr, max_splits=ms)
                                again = ops.split_kv_decode(q, kc, vc, bt, sl, S, fused=fused, norm_rope=nr,
                                                            max_splits=ms)
                                res += exact(f"G={n_q // n_kv} D={D} bs={bs} B={B} S={S}/{ms} fused={fused} "
                                             f"cluster={cluster}: second launch", again, o)
                            else:
                                ops.qk_norm_rope(q, k, qw, kw, cos_t, sin_t, pos, eps, store=(v, kc, vc, slots))
                                o = ops.split_kv_decode(q, kc, vc, bt, sl, S, fused=fused, max_splits=ms)
                            outs.append((o, kc, vc, buf))
                        torch.cuda.synchronize()
                        ops.DECODE_CLUSTER = True
                        tag = f"G={n_q // n_kv} D={D} bs={bs} B={B} S={S}/{ms} fused={fused} cluster={cluster}"
                        res += exact(f"{tag}: output", outs[1][0], outs[0][0])
                        res += exact(f"{tag}: k_cache", outs[1][1], outs[0][1])
                        res += exact(f"{tag}: v_cache", outs[1][2], outs[0][2])
                        res += exact(f"{tag}: qkv buffer left raw", outs[1][3], qkv)
        return res

    C.run("qk", "split_kv_decode(norm_rope) == qk_norm_rope + split_kv_decode", run)


def decode_step_inputs(lens: list[int], n_q: int, n_kv: int, D: int, bs: int, gen, dev) -> tuple:
    """A decode step's inputs on ``dev`` for rows of ``lens`` keys: paged caches (``build_paged``) whose new keys' rows
    hold NaN until ``qk_norm_rope`` stores them (so a read of one before the store shows), the table and lengths, the
    positions and slots (``decode_positions``), the qkv GEMM's raw rows and the q/k norm weights ->
    (k_cache, v_cache, tables, lens, positions, slots, qkv, q_weight, k_weight)."""
    kc0, vc0, bt, sl = build_paged(lens, bs, n_kv, D, gen, dev)
    pos, slots = decode_positions(lens, bt.cpu(), bs)
    flat_k, flat_v = kc0.view(-1, n_kv, D), vc0.view(-1, n_kv, D)
    for sl_ in slots.tolist():
        if sl_ >= 0:
            flat_k[sl_] = float("nan")
            flat_v[sl_] = float("nan")
    qkv = (torch.randn(len(lens), (n_q + 2 * n_kv) * D, generator=gen) * 2).to(torch.bfloat16).to(dev)
    qw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
    kw = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(dev)
    return kc0, vc0, bt, sl, pos.to(dev), slots.to(dev), qkv, qw, kw


def same_step(tag: str, outs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[tuple[bool, str]]:
    """Two ways of one decode step's attention, each (output, k_cache, v_cache): all three bitwise equal (after a
    synchronize), and no NaN in the second's output (a new key's row read before its store)."""
    torch.cuda.synchronize()
    res = []
    for i, what in enumerate(("output", "k_cache", "v_cache")):
        res += exact(f"{tag}: {what}", outs[1][i], outs[0][i])
    nan = bool(torch.isnan(outs[1][0].float()).any())
    return res + [(not nan, f"{tag}: no NaN in the output: {not nan}")]


def check_early_attention(C: Checks, dev, gen) -> None:
    """``split_kv_decode(early=True)`` (``split_kv_early_partials``: the first two tiles' cached rows read
    before the wait for the launch before it, less each sequence's last key) right after
    ``qk_norm_rope(store=...)``, bitwise equal to the same pair with ``early=False``: the output and both
    caches. Each new key's cache row holds NaN until the store, so a read of it before the store shows.
    GQA groups of 2-8, head dims 32-128, block sizes 16 and 5; the new key in tile 0, in tile 1, past them
    and on a split's first key; one to many splits, one launch and partials + reduce, fused RoPE; a padding
    row (length 0, slot -1); three rounds each, the last two with ``qk_norm_rope(trigger_first=True)`` (the
    attention scheduled before qk_norm_rope waits)."""
    def run():
        res = []
        eps, max_pos = 1e-6, 8192
        lens = [300, 1, 64, 65, 100, 129, 0, 257, 4097, 200, 128, 50]
        for n_q, n_kv, D, bs in ((16, 8, 128, 16), (32, 8, 128, 16), (8, 2, 64, 5), (8, 4, 32, 16)):
            cos_t, sin_t = rope_tables(D, max_pos, dev)
            kc0, vc0, bt, sl, pos, slots, qkv, qw, kw = decode_step_inputs(lens, n_q, n_kv, D, bs, gen, dev)
            for S, fused, rope in ((64, True, False), (128, True, False), (128, False, False), (100000, True, False),
                                   (None, True, False), (128, True, True), (256, False, True)):
                for rnd in range(3):
                    outs = []
                    for early in (False, True):
                        buf = qkv.clone()
                        q, k, v = qkv_views(buf, n_q, n_kv, D)
                        kc, vc = kc0.clone(), vc0.clone()
                        ops.qk_norm_rope(q, k, qw, kw, cos_t, sin_t, pos, eps, rotate_k=not rope,
                                         store=(v, kc, vc, slots), trigger_first=early and rnd > 0)
                        o = ops.split_kv_decode(q, kc, vc, bt, sl, S, fused=fused, early=early,
                                                rope=(cos_t, sin_t) if rope else None)
                        outs.append((o, kc, vc))
                    res += same_step(f"G={n_q // n_kv} D={D} bs={bs} S={S} fused={fused} rope={rope} round {rnd} "
                                     f"trigger={rnd > 0}", outs)
        return res

    C.run("early", "qk_norm_rope(store) + split_kv_decode(early) == the same with early=False", run)


def check_kv_prefetch(C: Checks, dev, gen) -> None:
    """``ops.kv_prefetch`` (one bulk L2 prefetch a cached page, writes nothing) between ``qk_norm_rope(store=...)``
    and ``split_kv_decode``, as the step's order has a layer's prefetch between two launches: the output and both
    caches bitwise equal to the pair without it, and no NaN in the output (each new key's cache row holds NaN until
    the store, so an attention that overtook the store through the prefetch's early trigger would show it). The
    caches after a prefetch alone are bitwise their copies before. GQA 2 and 4, head dims 64 and 128, block sizes
    16, 5 and 256 (a 512 KiB page: one bulk prefetch); a padding row; caps of L2, three pages a row and one; the bulk
    prefetch and the line prefetch (``lines=True``)."""
    def run():
        res = []
        eps, max_pos = 1e-6, 8192
        lens = [300, 1, 64, 0, 257, 4097, 200, 128]
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size
        for n_q, n_kv, D, bs in ((16, 8, 128, 16), (8, 2, 64, 5), (16, 8, 128, 256)):
            cos_t, sin_t = rope_tables(D, max_pos, dev)
            kc0, vc0, bt, sl, pos, slots, qkv, qw, kw = decode_step_inputs(lens, n_q, n_kv, D, bs, gen, dev)
            page = bs * n_kv * D * 2
            for cap, lines in ((l2, False), (l2, True), (3 * 2 * page * len(lens), False), (2 * page * len(lens), True)):
                kc, vc = kc0.clone(), vc0.clone()
                ops.kv_prefetch(kc, vc, bt, sl, cap, lines=lines)
                torch.cuda.synchronize()
                tag = f"G={n_q // n_kv} D={D} bs={bs} cap={cap} lines={lines}"
                res += exact(f"{tag}: k_cache after a prefetch", kc, kc0)
                res += exact(f"{tag}: v_cache after a prefetch", vc, vc0)
                for S, fused in ((128, True), (128, False), (None, True)):
                    outs = []
                    for prefetch in (False, True):
                        q, k, v = qkv_views(qkv.clone(), n_q, n_kv, D)
                        kc, vc = kc0.clone(), vc0.clone()
                        ops.qk_norm_rope(q, k, qw, kw, cos_t, sin_t, pos, eps, store=(v, kc, vc, slots))
                        if prefetch:
                            ops.kv_prefetch(kc, vc, bt, sl, cap, lines=lines)
                        outs.append((ops.split_kv_decode(q, kc, vc, bt, sl, S, fused=fused), kc, vc))
                    res += same_step(f"{tag} S={S} fused={fused}", outs)
        return res

    C.run("kvpf", "qk_norm_rope(store) + kv_prefetch + split_kv_decode == the same without the prefetch", run)


SECTIONS = {
    "prefill": check_prefill, "splitkv": check_split_kv, "merge": check_merge,
    "elementwise": check_elementwise, "sampling": check_sampling, "graph": check_graph,
    "gemm": check_gemm, "gemm_swiglu": check_gemm_swiglu, "invariant": check_invariant_attention, "fused_rope": check_fused_rope,
    "skinny": check_skinny, "epilogue": check_skinny_epilogues, "fused": check_fused_decode,
    "staged": check_skinny_staged, "staged_wide": check_skinny_staged_wide, "qk": check_qk_attention,
    "cluster": check_skinny_cluster,
    "wg": check_skinny_wg,
    "wg-norm": check_skinny_wg_norm,
    "early": check_early_attention,
    "kvpf": check_kv_prefetch,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=None, help="replay a run (default: a fresh random seed)")
    ap.add_argument("--time", action="store_true", help="also time split-KV decode and paged prefill")
    ap.add_argument("--only", nargs="*", choices=sorted(SECTIONS), help="run only these sections")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("check_kernels: no CUDA device", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}  (replay: python benches/gpu/check_kernels.py --seed {seed})")
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    dev = torch.device("cuda", torch.cuda.current_device())
    t0 = time.time()
    kernels.load_all()
    print(f"kernels compiled/loaded in {time.time() - t0:.1f} s")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    C = Checks()
    for name in (args.only or list(SECTIONS)):
        print(f"\n== {name} ==", flush=True)
        t1 = time.time()
        SECTIONS[name](C, dev, gen)
        print(f"   ({time.time() - t1:.1f} s)")
    if args.time:
        try:
            timing(dev, gen)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            C.record("timing", "timing", False, f"exception: {e}")
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
