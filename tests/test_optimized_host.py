"""The optimized engine's host side on the CPU: ``optimized/runner.py`` and ``optimized/engine.py`` run
with a torch stand-in for every CUDA kernel (``optimized.ops``), graphs off. This checks the Python the
GPU runs cannot check cheaply — the packed metadata of a decode step, bucket padding, launch guards, page
operations (swap, copy-on-write), in-place weight updates — against the reference engine. The kernels
themselves are checked on the GPU (``benches/gpu/check_kernels.py``, conformance)."""

from __future__ import annotations

import types

import pytest
import torch

import reference
from reference import attention
from reference.model import apply_rope, rms_norm
from reference.sampling import sample_one
from reference.weights import random_weights

from _helpers import TINY, tiny_weights


def _standin_ops() -> types.SimpleNamespace:
    def store_kvcache(k, v, kc, vc, slots):
        keep = slots >= 0
        s = slots[keep].long()
        kc.view(-1, *kc.shape[2:])[s] = k[keep]
        vc.view(-1, *vc.shape[2:])[s] = v[keep]

    def embedding(ids, table):
        return table[ids.long()].clone()

    def add_rmsnorm(x, residual, w, eps):
        residual.copy_(residual + x)
        return rms_norm(residual, w, eps)

    def qk_norm_rope(q, k, qw, kw, cos, sin, positions, eps):
        p = positions.long()
        c = torch.cat([cos[p], cos[p]], -1)
        s_ = torch.cat([sin[p], sin[p]], -1)
        q.copy_(apply_rope(rms_norm(q, qw, eps), c, s_))
        k.copy_(apply_rope(rms_norm(k, kw, eps), c, s_))

    def silu_mul(x):
        i = x.shape[1] // 2
        return (torch.nn.functional.silu(x[:, :i].float()) * x[:, i:].float()).to(x.dtype)

    def paged_prefill(q, kc, vc, bt, lens, qidx, qpos, scale=None):
        return attention.paged_prefill(q, kc, vc, bt.long(), lens.long(), qidx.long(), qpos.long(), scale)

    def split_kv_decode(q, kc, vc, bt, lens, split, scale=None, *, max_splits=None):
        o, lse = attention.split_kv_partials(q, kc, vc, bt.long(), lens.long(), split, scale, max_splits)
        return attention.reduce_splits(o, lse)[0].to(q.dtype)

    def sample(logits, temperature, top_k, top_p, seed_lo, seed_hi, pos, mode):
        toks, lps = [], []
        for b in range(logits.shape[0]):
            seed = (int(seed_lo[b]) & 0xFFFFFFFF) | ((int(seed_hi[b]) & 0xFFFFFFFF) << 32)
            sp = reference.SamplingParams(temperature=float(temperature[b]), top_k=int(top_k[b]),
                                          top_p=min(1.0, max(float(top_p[b]), 1e-6)), seed=seed,
                                          logprobs_mode="processed" if int(mode[b]) else "raw")
            t, lp = sample_one(logits[b].float(), sp, int(pos[b]))
            toks.append(t)
            lps.append(lp)
        return torch.tensor(toks, dtype=torch.int32), torch.tensor(lps, dtype=torch.float32)

    return types.SimpleNamespace(store_kvcache=store_kvcache, embedding=embedding, rmsnorm=rms_norm,
                                 add_rmsnorm=add_rmsnorm, qk_norm_rope=qk_norm_rope, silu_mul=silu_mul,
                                 paged_prefill=paged_prefill, split_kv_decode=split_kv_decode, sample=sample,
                                 ATTN_HEAD_DIMS=(32, 64, 128))


@pytest.fixture
def opt_engine(monkeypatch):
    """``factory(**engine_kwargs)`` -> an optimized.Engine on the CPU with the stand-in kernels."""
    import optimized.engine as oe
    import optimized.runner as orun
    monkeypatch.setattr(orun, "ops", _standin_ops())
    monkeypatch.setattr(oe, "require_cuda", lambda device: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: None)

    def make(**kw):
        kw = {"block_size": 4, "max_model_len": 128, "num_blocks": 256, "split_kv": "fixed:8", **kw}
        return oe.Engine.from_state_dict(TINY, tiny_weights(0), device="cpu", use_graphs=False, **kw)
    return make


def _reference(**kw):
    kw = {"block_size": 4, "max_model_len": 128, "num_blocks": 256, "split_kv": "fixed:8", "dtype": "bfloat16", **kw}
    return reference.Engine.from_state_dict(TINY, tiny_weights(0), **kw)


def _rollout(eng, prompts, sps, turns=3):
    sids = [eng.rollout_add(p, sp) for p, sp in zip(prompts, sps)]
    got = []
    for t in range(turns):
        outs = eng.rollout_run_turns()
        got.append([outs[s].token_ids for s in sids])
        for s in sids:
            if t + 1 < turns:
                eng.rollout_continue(s, [(s * 11 + t * 5 + i) % 512 for i in range((s + t) % 7)])
    for s in sids:
        eng.rollout_finish(s)
    assert eng.num_free_blocks == eng.num_blocks
    return got


PROMPTS = [[(7 * i + j) % 512 for j in range(n)] for i, n in enumerate((3, 4, 9, 17, 30))]


def _agree(a, b):
    pairs = [(x, y) for ta, tb in zip(a, b) for x, y in zip(ta, tb)]
    return sum(x == y for x, y in pairs) / len(pairs)


def test_optimized_host_side_matches_the_reference(opt_engine):
    sps = [reference.SamplingParams(max_tokens=6, stop_token_ids=())] * 3 + \
          [reference.SamplingParams(temperature=0.9, top_p=0.9, max_tokens=6, stop_token_ids=(), seed=s) for s in (1, 2)]
    got = _rollout(opt_engine(), PROMPTS, sps)
    ref = _rollout(_reference(), PROMPTS, sps)
    share = _agree(got, ref)
    print(f"optimized host side (stand-in kernels) vs reference bf16: {share:.0%} of turns identical")
    assert share >= 0.8, "the packed decode metadata or the bucket padding changed the computation"


def test_optimized_pool_pressure_swap_groups_and_weight_updates(opt_engine):
    sps = [reference.SamplingParams(max_tokens=6, stop_token_ids=())] * len(PROMPTS)
    small = opt_engine(num_blocks=20, swap_space=8)
    big = opt_engine()
    assert _rollout(small, PROMPTS, sps) == _rollout(big, PROMPTS, sps), "memory pressure changed the tokens"
    sch = small.scheduler
    assert sch.swaps + sch.evictions + sch.preemptions > 0 and not small.runner.host
    eng = opt_engine()
    gsps = [reference.SamplingParams(temperature=1.0, max_tokens=4, stop_token_ids=(), seed=i) for i in range(4)]
    sids = eng.rollout_add_group(list(range(16)), gsps)              # block-aligned prompt: copy-on-write
    outs = eng.rollout_run_turns()
    plain = opt_engine()
    psids = [plain.rollout_add(list(range(16)), sp) for sp in gsps]
    pouts = plain.rollout_run_turns()
    assert [outs[s].token_ids for s in sids] == [pouts[s].token_ids for s in psids]
    assert (eng.num_blocks - eng.num_free_blocks) < (plain.num_blocks - plain.num_free_blocks)
    new = random_weights(TINY, seed=1)
    eng.update_weights(new, recompute_kv=True)
    for s in sids:
        eng.rollout_continue(s, [1, 2])
    after = eng.rollout_run_turns()
    fresh = reference.Engine.from_state_dict(TINY, new, block_size=4, max_model_len=128, num_blocks=256,
                                             split_kv="fixed:8", dtype="bfloat16")
    ctx = list(range(16)) + outs[sids[0]].token_ids + [1, 2]
    assert after[sids[0]].weights_version == 1
    fsid = fresh.rollout_add(ctx, gsps[0])
    assert fresh.rollout_run_turns()[fsid].token_ids[:2] == after[sids[0]].token_ids[:2]
