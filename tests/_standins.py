"""Stand-ins for the CUDA kernels (``optimized.ops``) in torch, and the fixtures that run the optimized
engine's host side on the CPU with them (graphs off): ``launches`` (the stand-ins' launch log) and
``opt_engine`` (``factory(**engine_kwargs)`` -> an ``optimized.Engine``). Used by
``test_optimized_host.py`` and ``test_lookahead.py`` through ``conftest.py``."""

from __future__ import annotations

import types

import pytest
import torch

import reference
from reference import attention
from reference.model import apply_rope, linear, rms_norm
from reference.sampling import sample_one
from optimized import ops as real_ops

from _helpers import TINY, tiny_weights


def _rotated_cache(kc, bt, lens, rope):
    """Fused-RoPE stand-in: a copy of ``kc`` (pre-RoPE keys) with every key of every row rotated at its
    position through the runner's fp32 tables, as the kernels do tile by tile."""
    if rope is None:
        return kc
    cos, sin = rope
    out = kc.clone()
    bs = kc.shape[1]
    done = set()
    for b in range(bt.shape[0]):
        for p in range(int(lens[b])):
            page, slot = int(bt[b, p // bs]), p % bs
            if (page, slot) in done:
                continue
            done.add((page, slot))
            c = torch.cat([cos[p], cos[p]])[None, None, :]                      # [1, 1, D]
            s_ = torch.cat([sin[p], sin[p]])[None, None, :]
            out[page, slot] = apply_rope(kc[page, slot][None], c[0], s_[0])[0]
    return out


def _standin_ops(calls: list | None = None) -> types.SimpleNamespace:
    """torch stand-ins for ``optimized.ops``; ``calls`` (if given) records (kernel, details) per launch."""
    log = calls if calls is not None else []
    # the last qk_norm_rope launch: the slots its store wrote (None: no store), whether it let the next launch start
    # before its own wait
    last_qk: dict = {"slots": None, "trigger": False}

    def store_kvcache(k, v, kc, vc, slots):
        keep = slots >= 0
        s = slots[keep].long()
        kc.view(-1, *kc.shape[2:])[s] = k[keep]
        vc.view(-1, *vc.shape[2:])[s] = v[keep]

    def kv_prefetch(kc, vc, bt, lens, max_bytes, *, ctas=None, lines=False):   # an L2 hint: nothing changes; the launch is recorded
        assert kc.shape == vc.shape and bt.shape[0] == lens.shape[0] and isinstance(max_bytes, int)
        log.append(("kv_prefetch", (kc.data_ptr(), vc.data_ptr(), lens.clone(), max_bytes)))

    def embedding(ids, table):
        return table[ids.long()].clone()

    def embed_rmsnorm(ids, table, w, eps):
        log.append(("embed_rmsnorm", ids.shape[0]))
        residual = embedding(ids, table)
        return residual, rms_norm(residual, w, eps)

    def add_rmsnorm(x, residual, w, eps):
        residual.copy_(residual + x)
        return rms_norm(residual, w, eps)

    def qk_norm_rope(q, k, qw, kw, cos, sin, positions, eps, *, rotate_k=True, store=None, trigger_first=False):
        p = positions.long().clamp(min=0)
        c = torch.cat([cos[p], cos[p]], -1)
        s_ = torch.cat([sin[p], sin[p]], -1)
        log.append(("qk_norm_rope", rotate_k))
        last_qk.update(slots=None if store is None else store[3].clone(), trigger=trigger_first)
        q.copy_(apply_rope(rms_norm(q, qw, eps), c, s_))
        k.copy_(apply_rope(rms_norm(k, kw, eps), c, s_) if rotate_k else rms_norm(k, kw, eps))
        if store is not None:            # the fused KV write
            v, kc, vc, slots = store
            store_kvcache(k, v, kc, vc, slots)

    def silu_mul(x):
        i = x.shape[1] // 2
        return (torch.nn.functional.silu(x[:, :i].float()) * x[:, i:].float()).to(x.dtype)

    def paged_prefill(q, kc, vc, bt, lens, qidx, qpos, scale=None, *, rope=None, mean_keys=None):
        log.append(("paged_prefill", rope is not None))
        # the runner's hint for the choice of kernel: the mean count of keys a live query row sees
        live = qpos >= 0
        want = float((qpos[live].double() + 1).mean()) if bool(live.any()) else 0.0
        if mean_keys is None:            # a prefill graph's replay cannot know it; an eager step always does
            assert ns.allow_no_hint, "an eager prefill step launched without the mean keys a row sees"
        else:
            assert abs(mean_keys - want) <= 1e-9 * max(1.0, want), (mean_keys, want)
        kc = _rotated_cache(kc, bt, lens, rope)
        return attention.paged_prefill(q, kc, vc, bt.long(), lens.long(), qidx.long(), qpos.long(), scale)

    def split_kv_decode(q, kc, vc, bt, lens, split, scale=None, *, max_splits=None, row_seq=None, rope=None,
                        norm_rope=None, early=False):
        rows = bt.long() if row_seq is None else bt.long()[row_seq.long()]     # [B, M]: each row's table
        after_trigger = bool(log) and log[-1][0] == "qk_norm_rope" and last_qk["trigger"]
        log.append(("split_kv_decode", (row_seq is not None, lens.clone(), split, max_splits, rope is not None,
                                        norm_rope is not None, early, after_trigger)))
        assert early or not after_trigger, "qk_norm_rope triggered a launch that reads before its wait too late"
        if early:                        # the launch just before stored at most each row's last key (pdl.cuh)
            assert row_seq is None and norm_rope is None
            assert log[-2][0] == "qk_norm_rope" and last_qk["slots"] is not None, \
                "early attention not right after qk_norm_rope's store"
            bs, last = kc.shape[1], lens.long() - 1                                # [B]
            own = rows.gather(1, (last.clamp(min=0) // bs)[:, None])[:, 0] * bs + last.clamp(min=0) % bs
            slots = last_qk["slots"].long()
            assert bool(((slots < 0) | ((slots == own) & (last >= 0))).all()), \
                "early attention: the store before it wrote a key that is not its row's last"

        if norm_rope is not None:        # qk_norm_rope + its KV store in the launch; the raw q, k stay as they are
            assert row_seq is None and rope is None
            k, v, qw, kw, cos, sin, positions, slots, eps = norm_rope
            p = positions.long().clamp(min=0)
            c = torch.cat([cos[p], cos[p]], -1)
            s_ = torch.cat([sin[p], sin[p]], -1)
            q = apply_rope(rms_norm(q, qw, eps), c, s_)
            store_kvcache(apply_rope(rms_norm(k, kw, eps), c, s_), v, kc, vc, slots)
        kc = _rotated_cache(kc, rows, lens, rope)
        o, lse = attention.split_kv_partials(q, kc, vc, rows, lens.long(), split, scale, max_splits)
        return attention.reduce_splits(o, lse)[0].to(q.dtype)

    def gemm(x, w, *, out_dtype=torch.bfloat16, swiglu=False):
        log.append(("gemm_swiglu" if swiglu else "gemm", x.shape[0]))
        y = linear(x, w, batch_invariant=True)
        return silu_mul(y) if swiglu else y.to(out_dtype)

    def skinny_gemm(x, w, *, out_dtype=torch.bfloat16, prefetch=True):
        log.append(("skinny_gemm", (x.shape[0], out_dtype)))
        if not prefetch:                 # the L2 prefetch before the PDL wait turned off
            log.append(("skinny_no_prefetch", tuple(w.shape)))
        return linear(x, w).to(out_dtype)

    def skinny_swiglu(x, w):         # the fused epilogue: the gate/up GEMM, then the activation
        log.append(("skinny_swiglu", x.shape[0]))
        return silu_mul(linear(x, w))

    def skinny_staged(x, w, *, out_dtype=torch.bfloat16, swiglu=False, kc=2048, stages=2, lanes=16, ctas_per_sm=1,
                      pre=None, evict_first=True, tp=1):
        assert x.shape[0] <= 32 and (tp == 1 or x.shape[0] > 8), "the staged kernels' row widths"
        # (the log's configuration: with tp only for the wide kernels, so that the 8-row records keep their shape)
        cfg = (kc, stages, lanes, ctas_per_sm, pre) + ((tp,) if x.shape[0] > 8 else ())
        log.append(("skinny_staged", (x.shape[0], w.data_ptr(), out_dtype, swiglu, *cfg, evict_first)))
        y = linear(x, w)
        return silu_mul(y) if swiglu else y.to(out_dtype)

    def skinny_cluster(x, w, *, out_dtype=torch.bfloat16, swiglu=False, kc=256, stages=3, tp=2, cluster=4, pre=None,
                       evict_first=True, warps=4):
        assert 16 < x.shape[0] <= real_ops.SKINNY_CLUSTER_MAX_M, "the cluster kernel's rows (the runner's 17-64)"
        assert (kc, stages, tp, cluster) in real_ops.SKINNY_CLUSTER_CONFIGS, "a built configuration"
        assert warps == 4 or (kc, stages, tp, cluster) in real_ops.SKINNY_CLUSTER_W8, "a built warp count"
        log.append(("skinny_cluster", (x.shape[0], w.data_ptr(), out_dtype, swiglu, kc, stages, tp, cluster, pre)
                    + ((warps,) if warps != 4 else ())))
        y = linear(x, w)
        return silu_mul(y) if swiglu else y.to(out_dtype)

    folded = {}                          # the residual epilogue's xw (data_ptr) -> (its stream's rows, the weight)

    def skinny_wg(x, w, *, out_dtype=torch.bfloat16, swiglu=False, wt=1, kp=1, pre=None, evict_first=True,
                  spread=False, residual=None, norm=None, stages=None):
        assert 16 < x.shape[0] <= real_ops.SKINNY_WG_MAX_M, "the warpgroup kernel's rows (the runner's 17-64)"
        kc = real_ops.skinny_wg_config(x.shape[0], wt, kp, stages)[0]     # a built configuration (else ValueError)
        M, K = x.shape
        assert K % (64 * kp) == 0 and (kp == 1 or (K // kp) % kc == 0), "a K the configuration takes"
        assert isinstance(spread, bool)
        log.append(("skinny_wg", (M, w.data_ptr(), out_dtype, swiglu, wt, kp)))
        if spread:
            log.append(("skinny_wg_spread", (M, w.data_ptr())))
        if stages is not None:
            log.append(("skinny_wg_stages", (M, w.data_ptr(), stages)))
        if residual is not None or norm is not None:
            assert wt == 1 and real_ops.skinny_wg_fold_ok(M, kp, stages) and (residual is None or norm is None)
        if norm is not None:             # the normed prologue: x is a residual epilogue's xw, ssq its stream's squares
            nssq, eps = norm
            stream, weight = folded.pop(x.data_ptr())
            assert torch.equal(x, (stream * weight).to(torch.bfloat16)), "x: the residual epilogue's stream x weight"
            assert nssq.shape == (-(-K // 64), 64), "the residual epilogue's sums before it (its N is this K)"
            torch.testing.assert_close(nssq[:, :M].sum(0), stream.float().pow(2).sum(1), rtol=1e-5, atol=0)
            log.append(("skinny_wg_norm", (M, w.data_ptr())))
            x = rms_norm(stream, weight, eps)    # (add_rmsnorm's stand-in's bits: the kernel rounds elsewhere)
        y = linear(x, w)
        if residual is not None:         # the residual epilogue: the stream += bf16(y) in place; ssq; xw
            stream, ssq, weight = residual
            assert swiglu is False and ssq.shape == (-(-w.shape[0] // 64), 64)
            log.append(("skinny_wg_residual", (M, w.data_ptr(), weight.data_ptr())))
            stream.copy_(stream + y.to(torch.bfloat16))
            sq = stream.float().pow(2)                         # [M, N]
            ssq[:, :M] = torch.stack([sq[:, u * 64:(u + 1) * 64].sum(1) for u in range(ssq.shape[0])])
            xw = (stream * weight).to(torch.bfloat16)
            folded[xw.data_ptr()] = (stream.clone(), weight)
            return xw
        return silu_mul(y) if swiglu else y.to(out_dtype)

    def sample(logits, temperature, top_k, top_p, seed_lo, seed_hi, pos, mode, *, tokens=None, logprobs=None):
        toks, lps = [], []
        for b in range(logits.shape[0]):
            seed = (int(seed_lo[b]) & 0xFFFFFFFF) | ((int(seed_hi[b]) & 0xFFFFFFFF) << 32)
            sp = reference.SamplingParams(temperature=float(temperature[b]), top_k=int(top_k[b]),
                                          top_p=min(1.0, max(float(top_p[b]), 1e-6)), seed=seed,
                                          logprobs_mode="processed" if int(mode[b]) else "raw")
            t, lp = sample_one(logits[b].float(), sp, int(pos[b]))
            toks.append(t)
            lps.append(lp)
        toks, lps = torch.tensor(toks, dtype=torch.int32), torch.tensor(lps, dtype=torch.float32)
        if tokens is not None:           # the kernel's output buffers (ops.sample wants them 16-byte aligned)
            assert tokens.data_ptr() % 16 == 0 and logprobs.data_ptr() % 16 == 0, "outputs off a 16-byte boundary"
            tokens.copy_(toks)
            logprobs.copy_(lps)
            return tokens, logprobs
        return toks, lps

    ns = types.SimpleNamespace(store_kvcache=store_kvcache, kv_prefetch=kv_prefetch, embedding=embedding,
                               embed_rmsnorm=embed_rmsnorm, rmsnorm=rms_norm,
                               add_rmsnorm=add_rmsnorm, qk_norm_rope=qk_norm_rope, silu_mul=silu_mul,
                               paged_prefill=paged_prefill, split_kv_decode=split_kv_decode, sample=sample,
                               gemm=gemm, skinny_gemm=skinny_gemm, skinny_swiglu=skinny_swiglu, skinny_staged=skinny_staged,
                               skinny_cluster=skinny_cluster, SKINNY_CLUSTER_MAX_M=real_ops.SKINNY_CLUSTER_MAX_M,
                               skinny_wg=skinny_wg, SKINNY_WG_MAX_M=real_ops.SKINNY_WG_MAX_M,
                               skinny_wg_config=real_ops.skinny_wg_config, skinny_wg_rows=real_ops.skinny_wg_rows,
                               skinny_wg_split=real_ops.skinny_wg_split,
                               skinny_wg_ssq=real_ops.skinny_wg_ssq, skinny_wg_fold_ok=real_ops.skinny_wg_fold_ok,
                               SKINNY_MAX_M=16, SKINNY_STAGED_MAX_M=real_ops.SKINNY_STAGED_MAX_M,
                               skinny_staged_rows=real_ops.skinny_staged_rows,
                               ATTN_HEAD_DIMS=(16, 32, 64, 128), allow_no_hint=False)
    return ns


@pytest.fixture
def launches() -> list:
    """The stand-in kernels' launch log of the test's engines."""
    return []


def run_on_cpu(patch, ops) -> None:
    """Point the optimized engine at the CPU and its runner at ``ops`` (the stand-in kernels). ``patch``:
    ``setattr``-like, e.g. ``monkeypatch.setattr``."""
    import optimized.engine as oe
    import optimized.runner as orun
    patch(orun, "ops", ops)
    patch(oe, "require_cuda", lambda device: torch.device("cpu"))
    patch(torch.cuda, "set_device", lambda dev: None)


@pytest.fixture
def opt_engine(monkeypatch, launches):
    """``factory(use_graphs=False, **engine_kwargs)`` -> an optimized.Engine on the CPU with the stand-in kernels
    (``use_graphs=True`` needs the stand-in graph API of ``_graph_standin.py``)."""
    import optimized.engine as oe
    run_on_cpu(monkeypatch.setattr, _standin_ops(launches))

    def make(use_graphs: bool = False, **kw):
        kw = {"block_size": 4, "max_model_len": 128, "num_blocks": 256, "split_kv": "fixed:8", **kw}
        return oe.Engine.from_state_dict(TINY, tiny_weights(0), device="cpu", use_graphs=use_graphs, **kw)
    return make
