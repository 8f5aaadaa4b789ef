"""The optimized engine's host side on the CPU: ``optimized/runner.py`` and ``optimized/engine.py`` run
with a torch stand-in for every CUDA kernel (``optimized.ops``), graphs off. This checks the Python the
GPU runs cannot check cheaply — the packed metadata of a decode step, bucket padding, launch guards, page
operations (swap, copy-on-write), in-place weight updates — against the reference engine (the stand-ins
and the ``opt_engine`` fixture: ``_standins.py``). The kernels themselves are checked on the GPU
(``benches/gpu/check_kernels.py``, conformance)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import reference
from reference.weights import random_weights

from _helpers import TINY, rollout_turns, rope_rollout, target_logits, tiny_weights


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


# ----------------------------------------------------------------------------- batch-invariant mode, fused RoPE

@pytest.mark.parametrize("split_kv", ["fixed:3", "disabled"])
def test_invariant_mode_plumbing_and_bitwise_rows(opt_engine, launches, split_kv):
    """With the stand-ins (per-row math), the invariant runner must route every GEMM through ``ops.gemm``,
    every prefill token through the split-KV path as its own row (length position + 1, its sequence's
    table), never through ``paged_prefill``; and a sequence's logits are then bitwise the same alone,
    with batch mates, and as a single-shot prefill of the whole context."""
    import random
    rng = random.Random(3)
    target = [rng.randrange(512) for _ in range(13)]
    obs = [rng.randrange(512) for _ in range(9)]
    alone, toks, ctx = target_logits(opt_engine(batch_invariant=True, split_kv=split_kv), target, [], obs)
    kinds = {k for k, _ in launches}
    assert "paged_prefill" not in kinds and "gemm" in kinds and "skinny_gemm" not in kinds, kinds
    # per layer qkv, o_proj and down through ops.gemm, gate/up through its SwiGLU epilogue; + the LM head
    n_gemm = sum(k == "gemm" for k, _ in launches)
    n_swiglu = sum(k == "gemm_swiglu" for k, _ in launches)
    layers = TINY.num_hidden_layers
    assert n_swiglu > 0 and (n_gemm - n_swiglu * 3) * layers == n_swiglu, (n_gemm, n_swiglu)
    unfused = opt_engine(batch_invariant=True, split_kv=split_kv)
    unfused.runner.fuse_swiglu = False
    launches.clear()
    off, toks_off, _ = target_logits(unfused, target, [], obs)
    assert "gemm_swiglu" not in {k for k, _ in launches}
    assert toks_off == toks and torch.equal(off, alone), "fuse_swiglu changed the invariant engine's logits"
    prefill_rows = [d for k, d in launches if k == "split_kv_decode" and d[0]]
    assert prefill_rows, "no prefill token went through the split-KV path"
    split = 3 if split_kv == "fixed:3" else 128                      # disabled: one split of max_model_len
    first = prefill_rows[0]
    assert first[1].tolist() == list(range(1, 14)), "prefill rows must have length position + 1"
    assert first[2] == split and first[3] == -(-13 // split)
    mates = [[rng.randrange(512) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    crowd, toks_crowd, _ = target_logits(opt_engine(batch_invariant=True, split_kv=split_kv), target, mates, obs)
    assert toks_crowd == toks and torch.equal(crowd, alone), "INVARIANT: batch mates changed the target's logits"
    single = opt_engine(batch_invariant=True, split_kv=split_kv)
    single.record_logits()
    single.generate([ctx], reference.SamplingParams(max_tokens=5, stop_token_ids=()))
    assert torch.equal(torch.stack(single.logit_log[0]), alone[5:]), "INVARIANT: resume differs from single-shot"


def test_default_mode_staged_then_cublas_and_paged_prefill(opt_engine, launches):
    """Default mode: every GEMM of <= 8 rows (decode steps, short prefills) goes to the staged skinny
    kernel with the engine's configuration -- gate/up with the SwiGLU epilogue, the LM head with fp32
    output -- and larger ones to cuBLAS (not logged); never the register kernels, never the invariant GEMM."""
    eng = opt_engine()
    long_prompt = [(7 * i) % 512 for i in range(40)]                  # a 40-row prefill: cuBLAS
    _rollout(eng, PROMPTS[:2] + [long_prompt], [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 3,
             turns=2)
    kinds = {k for k, _ in launches}
    assert "paged_prefill" in kinds and not {"gemm", "skinny_gemm", "skinny_swiglu"} & kinds, kinds
    staged = [d for k, d in launches if k == "skinny_staged"]
    qkv = {L["wqkv"].data_ptr() for L in eng.runner.layers}
    gu = {L["wgu"].data_ptr() for L in eng.runner.layers}            # a few tiles: one wave of qkv's configuration
    three = (512, 4, 16, 3, 2)
    assert staged and all(m <= 8 and tuple(cfg) == (three if w in qkv | gu else (1024, 3, 16, 2, 2))
                          and ef is True for m, w, _, _, *cfg, ef in staged), staged   # evict-first weight copies
    assert {w for _, w, *_ in staged} >= qkv | gu, "every layer's qkv and gate/up GEMMs on their configuration"
    launches.clear()
    eng.runner.num_sms = 1                                          # gate/up's tiles now exceed one wave of 3
    _rollout(eng, PROMPTS[:2], [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 2, turns=1)
    big = [d for k, d in launches if k == "skinny_staged"]
    assert big and all(tuple(cfg) == (three if w in qkv else (1024, 3, 16, 2, 2)) for _, w, _, _, *cfg, _ in big)
    n_layers = TINY.num_hidden_layers
    swiglu = [m for m, _, dt, sw, *_ in staged if sw]
    head = [m for m, _, dt, sw, *_ in staged if dt == torch.float32]
    plain = [m for m, _, dt, sw, *_ in staged if not sw and dt == torch.bfloat16]
    assert swiglu and len(swiglu) % n_layers == 0, "gate/up + SwiGLU of every layer of a step"
    assert len(head) >= len(swiglu) // n_layers, "an fp32 LM head for every such step (and short prefills' logits)"
    assert sorted(plain) == sorted(m for m in swiglu for _ in range(3)), "qkv, o and down beside each gate/up"


def test_default_mode_skinny_gemm_then_cublas_and_paged_prefill(opt_engine, launches):
    """With the staged kernel off (``staged = {}``), GEMMs of <= 8 rows go to the register skinny kernels --
    qkv, o_proj, down_proj and the LM head (fp32 output) to skinny_gemm, gate/up with the SwiGLU epilogue
    (skinny_swiglu) -- and larger ones to cuBLAS (not logged); never the invariant GEMM.
    ``skinny_max_m = 0`` turns the skinny kernels, the staged ones (8 rows and 9-16) too, off."""
    eng = opt_engine()
    eng.runner.staged = {}
    long_prompt = [(7 * i) % 512 for i in range(40)]                  # a 40-row prefill: cuBLAS
    _rollout(eng, PROMPTS[:2] + [long_prompt], [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 3,
             turns=2)
    kinds = {k for k, _ in launches}
    assert "paged_prefill" in kinds and "gemm" not in kinds, kinds
    assert all(not d[0] for k, d in launches if k == "split_kv_decode"), "decode rows must use their own tables"
    skinny = [d for k, d in launches if k == "skinny_gemm"]
    assert skinny and all(m <= eng.runner.skinny_max_m for m, _ in skinny), skinny
    assert any(dt == torch.float32 for _, dt in skinny), "the LM head of a decode step must be an fp32 skinny GEMM"
    n_layers = TINY.num_hidden_layers
    bf16 = [m for m, dt in skinny if dt == torch.bfloat16]
    swiglu = [m for k, m in launches if k == "skinny_swiglu"]
    assert swiglu and len(swiglu) % n_layers == 0, "gate/up + SwiGLU of every layer of a step"
    assert sorted(bf16) == sorted(m for m in swiglu for _ in range(3)), "qkv, o and down beside each gate/up"
    launches.clear()
    off = opt_engine()
    off.runner.skinny_max_m = 0
    _rollout(off, PROMPTS[:2], [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 2, turns=2)
    assert not {"skinny_gemm", "skinny_swiglu", "skinny_staged"} & {k for k, _ in launches}
    off = opt_engine()                                # ... and the wide staged kernel of 9-16-row steps
    off.runner.skinny_max_m = 0
    twelve = [[(5 * i + j) % 512 for j in range(2 + i % 5)] for i in range(12)]
    _rollout(off, twelve, [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 12, turns=2)
    assert not {"skinny_gemm", "skinny_swiglu", "skinny_staged"} & {k for k, _ in launches}


def test_skinny_max_elems_sends_large_weights_to_cublas(opt_engine, launches):
    """``skinny_max_elems``: a decode GEMM whose weight has more elements goes to cuBLAS (not logged)
    whatever its row count -- gate/up then runs unfused, the LM head too -- and smaller ones stay skinny
    (the staged kernel off)."""
    eng = opt_engine()
    r = eng.runner
    r.staged = {}
    r.skinny_max_n = 0                                 # by size alone (skinny_max_n: the next test)
    wgu, wo = r.layers[0]["wgu"], r.layers[0]["wo"]
    assert r.lm_head.numel() > wgu.numel() > wo.numel(), "TINY's shapes no longer order as this test needs"
    r.skinny_max_elems = wgu.numel() - 1              # gate/up, qkv (as large in TINY) and the head: cuBLAS
    _rollout(eng, PROMPTS[:2], [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 2, turns=2)
    kinds = {k for k, _ in launches}
    skinny = [d for k, d in launches if k == "skinny_gemm"]
    assert "skinny_swiglu" not in kinds and skinny, kinds
    assert all(dt == torch.bfloat16 for _, dt in skinny), "the LM head is larger than the limit: cuBLAS"
    launches.clear()
    r.skinny_max_elems = r.lm_head.numel()
    _rollout(eng, PROMPTS[:2], [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 2, turns=2)
    assert "skinny_swiglu" in {k for k, _ in launches}
    assert any(dt == torch.float32 for k, (_, dt) in ((k, d) for k, d in launches if k == "skinny_gemm"))


def test_skinny_max_n_sends_few_row_weights_to_skinny_and_o_proj_prefetch_rule(opt_engine, launches):
    """``skinny_max_n``: a decode GEMM whose weight has at most that many rows goes to the skinny kernel
    whatever its size (qwen3-8b's o_proj and down); ``skinny_prefetch_o_max_elems``: o_proj's skinny GEMM
    keeps its L2 prefetch before the PDL wait only up to that many weight elements, no other GEMM loses it;
    the tokens are those of the all-cuBLAS engine (the stand-ins compute one product; the staged kernel off)."""
    sp = [reference.SamplingParams(max_tokens=4, stop_token_ids=())] * 2
    base = opt_engine()
    base.runner.skinny_max_m = 0
    want = _rollout(base, PROMPTS[:2], sp, turns=2)
    launches.clear()
    eng = opt_engine()
    r = eng.runner
    r.staged = {}
    L0 = r.layers[0]
    H = L0["wo"].shape[0]
    assert L0["wd"].shape[0] == H < min(L0["wqkv"].shape[0], L0["wgu"].shape[0], r.lm_head.shape[0]), \
        "TINY's shapes no longer order as this test needs"
    r.skinny_max_elems, r.skinny_max_n = 0, H          # by size nothing is skinny; by rows o_proj and down
    assert _rollout(eng, PROMPTS[:2], sp, turns=2) == want
    skinny = [d for k, d in launches if k == "skinny_gemm"]
    assert skinny and len(skinny) % (2 * TINY.num_hidden_layers) == 0, "o_proj and down of each layer pass"
    assert all(m <= r.skinny_max_m and dt == torch.bfloat16 for m, dt in skinny), "no LM head, no large step"
    assert "skinny_swiglu" not in {k for k, _ in launches}
    assert not [k for k, _ in launches if k == "skinny_no_prefetch"], "small enough: o_proj keeps its prefetch"
    launches.clear()
    r.skinny_prefetch_o_max_elems = L0["wo"].numel() - 1
    _rollout(eng, PROMPTS[:2], sp, turns=2)
    off = [d for k, d in launches if k == "skinny_no_prefetch"]
    n_skinny = sum(k == "skinny_gemm" for k, _ in launches)
    assert off and set(off) == {tuple(L0["wo"].shape)} and 2 * len(off) == n_skinny, (off, n_skinny)


def test_swiglu_epilogue_switch(opt_engine, launches):
    """``fuse_swiglu = False`` runs gate/up as skinny_gemm + silu_mul (the staged kernel off); with the
    stand-ins (whose fused op composes the unfused pair) the rollouts agree token for token; batch-invariant
    mode never fuses."""
    runs = []
    for fuse in (True, False):
        launches.clear()
        eng = opt_engine()
        eng.runner.staged = {}
        eng.runner.fuse_swiglu = fuse
        runs.append(_rollout(eng, PROMPTS[:3], [reference.SamplingParams(max_tokens=4, stop_token_ids=())] * 3, turns=2))
        kinds = {k for k, _ in launches}
        assert ("skinny_swiglu" in kinds) == fuse and "skinny_gemm" in kinds, kinds
    assert runs[0] == runs[1]
    launches.clear()
    _rollout(opt_engine(batch_invariant=True), PROMPTS[:2], [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 2,
             turns=2)
    assert not {"skinny_swiglu", "skinny_gemm", "skinny_staged"} & {k for k, _ in launches}


def test_staged_roles_route_decode_gemms_and_nothing_else(opt_engine, launches):
    """``staged`` (``staged_one_wave`` off): the decode GEMMs of the roles it names -- and only those, only at
    <= 8 rows -- go to ``skinny_staged`` with the role's (stages, CTAs per SM, early stages): gate/up with the SwiGLU
    epilogue (or, with ``fuse_swiglu`` off, unfused then ``silu_mul``), the LM head with fp32 out; the
    rollout is the one of the engine without it (the stand-ins compute the same product); weights below
    ``staged_min_elems`` take the register kernels' rules; batch-invariant mode ignores it."""
    sps = [reference.SamplingParams(max_tokens=4, stop_token_ids=())] * 3
    plain = opt_engine()
    plain.runner.staged = {}
    base = _rollout(plain, PROMPTS[:3], sps, turns=2)
    roles = {"qkv": (2048, 2, 16, 1, 2), "o_proj": (512, 4, 16, 2, 0), "gate_up": (2048, 3, 16, 1, 3),
             "down": (1024, 4, 16, 1, 2), "lm_head": (1024, 3, 16, 2, 3)}
    for picked in (("gate_up",), ("qkv", "lm_head"), tuple(roles)):
        for fuse in (True, False):
            launches.clear()
            eng = opt_engine()
            eng.runner.fuse_swiglu = fuse
            eng.runner.staged = {r: roles[r] for r in picked}
            eng.runner.staged_one_wave = {}                    # (the one-wave rule: the test above)
            eng.runner.staged_wide = {}                        # (9-32 rows: the next test)
            eng.runner.staged_evict_first = fuse               # the L2 policy flag passes through either way
            assert _rollout(eng, PROMPTS[:3], sps, turns=2) == base, (picked, fuse)
            staged = [d for k, d in launches if k == "skinny_staged"]
            assert staged and all(m <= 8 for m, *_ in staged), staged
            role_of = {eng.runner.lm_head.data_ptr(): "lm_head"}       # weight -> role, over every layer
            for L in eng.runner.layers:
                role_of.update({L["wqkv"].data_ptr(): "qkv", L["wo"].data_ptr(): "o_proj",
                                L["wgu"].data_ptr(): "gate_up", L["wd"].data_ptr(): "down"})
            seen = {role_of[ptr]: (dt, sw, cfg) for _, ptr, dt, sw, *cfg, _ef in staged}
            assert set(seen) == set(picked), (seen, picked)
            assert {ef for *_, ef in staged} == {fuse}, "evict_first is the runner's staged_evict_first"
            for r, (dt, sw, cfg) in seen.items():
                assert tuple(cfg) == roles[r], (r, cfg)
                assert sw == (r == "gate_up" and fuse), (r, sw, fuse)
                assert dt == (torch.float32 if r == "lm_head" else torch.bfloat16), (r, dt)
            if "gate_up" in picked:
                assert "skinny_swiglu" not in {k for k, _ in launches}
    launches.clear()
    eng = opt_engine()                                     # staged_min_elems: smaller weights take the rules
    eng.runner.staged = dict(roles)
    eng.runner.staged_wide = {}
    eng.runner.staged_min_elems = eng.runner.lm_head.numel()
    assert _rollout(eng, PROMPTS[:3], sps, turns=2) == base
    staged = [d for k, d in launches if k == "skinny_staged"]
    assert staged and {ptr for _, ptr, *_ in staged} == {eng.runner.lm_head.data_ptr()}, "only the LM head is that large"
    assert {"skinny_gemm", "skinny_swiglu"} <= {k for k, _ in launches}, "the layers' GEMMs on the register kernels"
    launches.clear()
    eng = opt_engine(batch_invariant=True)
    eng.runner.staged = dict(roles)
    _rollout(eng, PROMPTS[:2], sps[:2], turns=2)
    assert "skinny_staged" not in {k for k, _ in launches}


def test_bench_staged_adapter_launches_what_the_runner_launches(opt_engine, monkeypatch):
    """The GEMM bench's staged adapter (``benches/_ours.py``, ``skinny_staged``) builds the kernel's keywords from
    the class, without an engine: for ``STAGED_DEFAULT`` it must launch with the keywords a default engine's runner
    passes, the L2 policy included. (When ``_staged_kw`` became an instance method the adapter failed, on the GPU
    only: the kernel_gemm bench's staged rows raised a TypeError.)"""
    import optimized.ops as real_ops
    from optimized.runner import STAGED_DEFAULT, STAGED_EVICT_FIRST
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benches"))
    from _ours import skinny_staged
    calls = []
    monkeypatch.setattr(real_ops, "skinny_staged", lambda x, w, **kw: calls.append(kw) or x)
    skinny_staged(torch.randn(4, 64), torch.randn(32, 64), torch.bfloat16)()
    runner = opt_engine().runner
    assert runner.staged_evict_first is STAGED_EVICT_FIRST
    want = dict(out_dtype=torch.bfloat16, out=None, **runner._staged_kw(STAGED_DEFAULT, runner.staged_evict_first))
    assert calls == [want], (calls, want)
    assert want["evict_first"] is True and (want["kc"], want["stages"]) == STAGED_DEFAULT[:2], want


def test_staged_wide_routes_decode_gemms_of_9_to_32_rows(opt_engine, launches):
    """``staged_wide``: the GEMMs of 9-16 and 17-32 rows (decode steps of that batch, short prefills) go to
    ``skinny_staged`` with the configuration of their row width and role, tiles a stage included; GEMMs of 8 rows
    or fewer keep ``staged``, those of more than 32 rows, roles not named and weights of more than
    ``staged_wide_max_elems`` elements go to cuBLAS; the rollout is the one of the engine without it (the
    stand-ins compute the same product); batch-invariant mode ignores it. The default: every role at 9-16 rows on
    ``STAGED_WIDE16`` (TINY's weights are all under the limit), none at 17-32."""
    from optimized import runner as opt_runner

    prompts = [[(5 * i + j) % 512 for j in range(2 + i % 5)] for i in range(20)]
    sps = [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 20
    want = {}
    for n in (12, 20):                                # (a fresh engine each: the observations follow the ids)
        plain = opt_engine()
        plain.runner.staged = {}
        want[n] = _rollout(plain, prompts[:n], sps[:n], turns=2)
    wide = {16: {"qkv": (1024, 3, 16, 2, 2, 1), "gate_up": (512, 3, 16, 3, 1, 1), "lm_head": (512, 4, 16, 2, 0, 1)},
            32: {"qkv": (512, 2, 16, 2, 2, 2), "o_proj": (512, 3, 16, 3, 2, 1), "down": (512, 3, 16, 1, 3, 2)}}
    for n in (12, 20):
        launches.clear()
        eng = opt_engine()
        eng.runner.staged = {}
        eng.runner.staged_wide = {w: dict(d) for w, d in wide.items()}
        assert _rollout(eng, prompts[:n], sps[:n], turns=2) == want[n], n
        role_of = {eng.runner.lm_head.data_ptr(): "lm_head"}
        for L in eng.runner.layers:
            role_of.update({L["wqkv"].data_ptr(): "qkv", L["wo"].data_ptr(): "o_proj",
                            L["wgu"].data_ptr(): "gate_up", L["wd"].data_ptr(): "down"})
        staged = [d for k, d in launches if k == "skinny_staged"]
        assert staged and all(8 < m <= 32 for m, *_ in staged), staged      # ``staged`` is empty: no 8-row ones
        widths = {16 if m <= 16 else 32 for m, *_ in staged}
        assert (16 if n == 12 else 32) in widths, (n, widths)   # decode steps of 12 rows: the 16-row kernels
        for m, ptr, dt, sw, *cfg, _ef in staged:
            w = 16 if m <= 16 else 32
            role = role_of[ptr]
            assert tuple(cfg) == wide[w][role], (m, role, cfg)
            assert sw == (role == "gate_up") and dt == (torch.float32 if role == "lm_head" else torch.bfloat16)
        seen = {(16 if m <= 16 else 32, role_of[ptr]) for m, ptr, *_ in staged}
        assert all(role in wide[w] for w, role in seen), seen       # the roles not named: cuBLAS
        if n == 20:
            assert (32, "qkv") in seen and (32, "down") in seen, seen
    launches.clear()
    eng = opt_engine()                                # the default, and its size limit
    assert eng.runner.staged_wide == {16: {r: opt_runner.STAGED_WIDE16 for r in opt_runner.GEMM_ROLES}}
    eng.runner.staged = {}
    _rollout(eng, prompts[:12], sps[:12], turns=2)
    got = {(d[0], d[1]): tuple(d[4:-1]) for k, d in launches if k == "skinny_staged"}
    assert got and all(8 < m <= 16 and cfg == opt_runner.STAGED_WIDE16 for (m, _), cfg in got.items()), got
    assert {ptr for _, ptr in got} >= {L["wqkv"].data_ptr() for L in eng.runner.layers} | {eng.runner.lm_head.data_ptr()}
    launches.clear()
    eng = opt_engine()
    eng.runner.staged = {}
    eng.runner.staged_wide_max_elems = eng.runner.layers[0]["wqkv"].numel() - 1   # qkv (and the LM head) too large
    _rollout(eng, prompts[:12], sps[:12], turns=2)
    ptrs = {d[1] for k, d in launches if k == "skinny_staged"}
    assert ptrs and not ptrs & ({L["wqkv"].data_ptr() for L in eng.runner.layers} | {eng.runner.lm_head.data_ptr()})
    assert ptrs >= {L["wo"].data_ptr() for L in eng.runner.layers}, "o_proj is under the limit"
    launches.clear()
    eng = opt_engine()                                # 8 rows or fewer keep ``staged``; beyond 32 rows cuBLAS
    eng.runner.staged_wide = {w: dict(d) for w, d in wide.items()}
    long_prompt = [(7 * i) % 512 for i in range(40)]
    _rollout(eng, prompts[:2] + [long_prompt], sps[:3], turns=2)
    rows = [d[0] for k, d in launches if k == "skinny_staged"]
    assert rows and max(rows) <= 8, rows
    launches.clear()
    eng = opt_engine(batch_invariant=True)
    eng.runner.staged_wide = {w: dict(d) for w, d in wide.items()}
    _rollout(eng, prompts[:12], sps[:12], turns=2)
    assert "skinny_staged" not in {k for k, _ in launches}


def test_cluster_gemm_routes_gemms_of_17_to_64_rows(opt_engine, launches):
    """``cluster_gemm``: the GEMMs of 17-64 rows (decode steps of that batch, short prefills) go to
    ``skinny_cluster`` with their role's configuration, ahead of ``staged_wide``; 16 rows or fewer, more than 64,
    roles not named and weights above ``cluster_max_elems`` do not; the rollout is the one without it; batch-invariant
    mode and ``skinny_max_m = 0`` ignore it. The default: no role."""
    prompts = [[(5 * i + j) % 512 for j in range(2 + i % 5)] for i in range(20)]
    sps = [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 20
    plain = opt_engine()
    assert plain.runner.cluster_gemm == {}
    want = _rollout(plain, prompts, sps, turns=2)
    cfgs = {"qkv": (256, 3, 2, 4, 2), "gate_up": (256, 5, 1, 4, 3), "lm_head": (512, 2, 2, 4, 0, 8)}
    launches.clear()
    eng = opt_engine()
    eng.runner.cluster_gemm = dict(cfgs)
    eng.runner.staged_wide = {32: {r: (512, 3, 16, 3, 2, 1) for r in ("qkv", "o_proj", "gate_up", "down", "lm_head")}}
    assert _rollout(eng, prompts, sps, turns=2) == want
    role_of = {eng.runner.lm_head.data_ptr(): "lm_head"}
    for L in eng.runner.layers:
        role_of.update({L["wqkv"].data_ptr(): "qkv", L["wo"].data_ptr(): "o_proj",
                        L["wgu"].data_ptr(): "gate_up", L["wd"].data_ptr(): "down"})
    cl = [d for k, d in launches if k == "skinny_cluster"]
    assert cl and all(16 < m <= 64 for m, *_ in cl), cl
    assert {role_of[ptr] for _, ptr, *_ in cl} == set(cfgs), cl
    for _m, ptr, dt, sw, *cfg in cl:
        role = role_of[ptr]
        assert tuple(cfg) == cfgs[role] and sw == (role == "gate_up"), (role, cfg)
        assert dt == (torch.float32 if role == "lm_head" else torch.bfloat16)
    staged = {role_of[d[1]] for k, d in launches if k == "skinny_staged" and d[0] > 16}
    assert staged == {"o_proj", "down"}, staged       # the roles cluster_gemm leaves: staged_wide's
    launches.clear()
    eng = opt_engine()
    eng.runner.cluster_gemm = dict(cfgs)
    eng.runner.cluster_max_elems = eng.runner.layers[0]["wqkv"].numel()   # TINY's LM head (V x H) is above it
    _rollout(eng, prompts, sps, turns=2)
    ptrs = {d[1] for k, d in launches if k == "skinny_cluster"}
    assert ptrs == {L[r].data_ptr() for L in eng.runner.layers for r in ("wqkv", "wgu")}, "the LM head is too large"
    for kw in ({"batch_invariant": True}, {}):
        launches.clear()
        eng = opt_engine(**kw)
        eng.runner.cluster_gemm = dict(cfgs)
        if not kw:
            eng.runner.skinny_max_m = 0
        _rollout(eng, prompts, sps, turns=2)
        assert "skinny_cluster" not in {k for k, _ in launches}, kw
    launches.clear()
    eng = opt_engine()                                  # 12 rows: not the cluster kernel's
    eng.runner.cluster_gemm = dict(cfgs)
    _rollout(eng, prompts[:12], sps[:12], turns=2)
    assert all(d[0] > 16 for k, d in launches if k == "skinny_cluster")


def test_wg_gemm_routes_gemms_of_17_to_64_rows(opt_engine, launches):
    """``wg_gemm``: the GEMMs of 17-64 rows go to ``skinny_wg`` with their x tile's and role's (tiles a unit, CTAs
    splitting K), or one tile and ``ops.skinny_wg_split``'s split for None, ahead of ``cluster_gemm``; a K the
    configuration does not take, 16 rows or fewer, roles not named, an x tile not named, batch-invariant mode and
    ``skinny_max_m = 0`` do not; the rollout is the one without it. The default: no role."""
    prompts = [[(5 * i + j) % 512 for j in range(2 + i % 5)] for i in range(20)]
    sps = [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 20
    plain = opt_engine()
    assert plain.runner.wg_gemm == {}
    want = _rollout(plain, prompts, sps, turns=2)
    r = plain.runner
    K_of = {"qkv": r.layers[0]["wqkv"].shape[1], "gate_up": r.layers[0]["wgu"].shape[1], "lm_head": r.lm_head.shape[1]}
    cfgs = {"qkv": (1, 1), "gate_up": (2, 1), "lm_head": (1, 2)}
    assert all(K % 64 == 0 for K in K_of.values()), K_of   # (TINY's K: every configuration above takes them)
    launches.clear()
    eng = opt_engine()
    eng.runner.wg_gemm = {32: dict(cfgs), 64: dict(cfgs)}
    eng.runner.cluster_gemm = {"qkv": (256, 3, 2, 4, 2), "o_proj": (256, 3, 2, 4, 2)}
    assert _rollout(eng, prompts, sps, turns=2) == want
    role_of = {eng.runner.lm_head.data_ptr(): "lm_head"}
    for L in eng.runner.layers:
        role_of.update({L["wqkv"].data_ptr(): "qkv", L["wo"].data_ptr(): "o_proj",
                        L["wgu"].data_ptr(): "gate_up", L["wd"].data_ptr(): "down"})
    wg = [d for k, d in launches if k == "skinny_wg"]
    assert wg and all(16 < m <= 64 for m, *_ in wg), wg
    usable = {role for role in cfgs if K_of[role] % (64 * cfgs[role][1]) == 0
              and (cfgs[role][1] == 1 or (K_of[role] // cfgs[role][1]) % 128 == 0)}
    assert {role_of[ptr] for _, ptr, *_ in wg} == usable, (wg, usable)
    for _m, ptr, dt, sw, *cfg in wg:
        role = role_of[ptr]
        assert tuple(cfg) == cfgs[role] and sw == (role == "gate_up"), (role, cfg)
        assert dt == (torch.float32 if role == "lm_head" else torch.bfloat16)
    cl = {role_of[d[1]] for k, d in launches if k == "skinny_cluster"}
    assert cl == {"o_proj"}, cl                         # qkv: the warpgroup kernel's first
    for kw in ({"batch_invariant": True}, {}):
        launches.clear()
        eng = opt_engine(**kw)
        eng.runner.wg_gemm = {32: dict(cfgs), 64: dict(cfgs)}
        if not kw:
            eng.runner.skinny_max_m = 0
        _rollout(eng, prompts, sps, turns=2)
        assert "skinny_wg" not in {k for k, _ in launches}, kw
    launches.clear()
    eng = opt_engine()
    eng.runner.wg_gemm = {32: {"qkv": (1, 8)}, 64: {"qkv": (1, 8)}}   # K / 8 not a multiple of 128 (TINY): not taken
    _rollout(eng, prompts, sps, turns=2)
    assert ("skinny_wg" in {k for k, _ in launches}) == (K_of["qkv"] % 1024 == 0)
    launches.clear()
    eng = opt_engine()                                  # None: one tile, the split rule's CTAs
    eng.runner.wg_gemm = {32: {"qkv": None, "gate_up": None}}
    _rollout(eng, prompts, sps, turns=2)
    wg = [d for k, d in launches if k == "skinny_wg"]
    assert wg and {d[3] for d in wg} == {False, True}, wg
    assert all(d[0] <= 32 and tuple(d[4:]) == (1, 1) for d in wg), wg   # TINY's weights: the rule's kp is 1
    launches.clear()
    eng = opt_engine()                                  # 12 rows: not the warpgroup kernel's
    eng.runner.wg_gemm = {32: dict(cfgs), 64: dict(cfgs)}
    _rollout(eng, prompts[:12], sps[:12], turns=2)
    assert all(d[0] > 16 for k, d in launches if k == "skinny_wg")

def test_wg_gemm_default_takes_every_role_by_the_split_rule(opt_engine, launches):
    """``runner.WG_GEMM`` (the default on a compute-capability-9.0 GPU): every GEMM role at both x tiles, each by the
    split rule (None). With it the rollout is the one without it, and every GEMM of 17-64 rows -- the four layer
    roles and the LM head -- goes to ``skinny_wg`` (TINY's K takes the rule's split, 1). Off the GPU it is off."""
    from optimized import runner as runner_mod

    assert set(runner_mod.WG_GEMM) == {32, 64}
    assert all(d == {r: None for r in runner_mod.GEMM_ROLES} for d in runner_mod.WG_GEMM.values())
    prompts = [[(3 * i + j) % 512 for j in range(2 + i % 4)] for i in range(40)]
    sps = [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 40
    plain = opt_engine()
    assert plain.runner.wg_gemm == {}                   # (a CPU engine)
    want = [_rollout(plain, prompts[:n], sps[:n], turns=2) for n in (20, 40)]   # decode steps of 20 and 40 rows
    launches.clear()
    eng = opt_engine()
    eng.runner.wg_gemm = {n: dict(d) for n, d in runner_mod.WG_GEMM.items()}
    assert [_rollout(eng, prompts[:n], sps[:n], turns=2) for n in (20, 40)] == want
    role_of = {eng.runner.lm_head.data_ptr(): "lm_head"}
    for L in eng.runner.layers:
        role_of.update({L["wqkv"].data_ptr(): "qkv", L["wo"].data_ptr(): "o_proj",
                        L["wgu"].data_ptr(): "gate_up", L["wd"].data_ptr(): "down"})
    wg = [d for k, d in launches if k == "skinny_wg"]
    assert {role_of[d[1]] for d in wg} == set(runner_mod.GEMM_ROLES), wg
    assert {d[0] <= 32 for d in wg} == {True, False}, "both x tiles"
    assert all(tuple(d[4:]) == (1, 1) for d in wg), wg
    assert not any(k in ("skinny_cluster", "skinny_staged") and d[0] > 16 for k, d in launches)

def _turns(eng, prompts, sps, turns=2):
    """``_rollout``'s turns with their logprobs: [(token ids, logprobs) per sequence] per turn."""
    sids = [eng.rollout_add(p, sp) for p, sp in zip(prompts, sps)]
    got = []
    for t in range(turns):
        outs = eng.rollout_run_turns()
        got.append([(outs[s].token_ids, outs[s].logprobs) for s in sids])
        if t + 1 < turns:
            for s in sids:
                eng.rollout_continue(s, [(s * 13 + t + i) % 512 for i in range(1 + s % 4)])
    for s in sids:
        eng.rollout_finish(s)
    return got


def test_fold_norms_into_the_warpgroup_gemms(opt_engine, launches):
    """``fuse_norm_gemm`` (on by default): a decode step of 17-64 rows whose four layer GEMMs are on the warpgroup
    kernel with 64-row units folds the add_rmsnorms between them into them. Each step and layer, o_proj and down
    (but the last layer's) write the residual stream, its sums of squares and the stream times the next norm's
    weight (``residual=``), gate/up and qkv (but the first layer's) take those (``norm=``; the stand-in checks
    that it is handed the epilogue's output and the sums of its stream), and the tokens and logprobs are the ones
    without it. Not folded: ``fuse_norm_gemm`` off, a role on two tiles a unit, the SwiGLU epilogue off,
    batch-invariant mode, 16 rows or fewer, a runner whose ``_reduce`` sums (tensor parallelism)."""
    from optimized import runner as runner_mod

    prompts = [[(3 * i + j) % 512 for j in range(2 + i % 4)] for i in range(24)]
    sps = [reference.SamplingParams(max_tokens=3, stop_token_ids=(), logprobs=True)] * 24

    def run(n=24, **attrs):
        launches.clear()
        eng = opt_engine()
        eng.runner.wg_gemm = {k: dict(d) for k, d in runner_mod.WG_GEMM.items()}
        for k, v in attrs.items():
            setattr(eng.runner, k, v)
        return eng, _turns(eng, prompts[:n], sps[:n])

    eng, want = run(fuse_norm_gemm=False)
    assert not any(k in ("skinny_wg_residual", "skinny_wg_norm") for k, _ in launches)
    assert eng.runner.fuse_norm_gemm is False and opt_engine().runner.fuse_norm_gemm is True
    eng, got = run()
    assert got == want
    Ls = eng.runner.layers
    res = [d for k, d in launches if k == "skinny_wg_residual"]
    nrm = [d for k, d in launches if k == "skinny_wg_norm"]
    steps = sum(1 for d in res if d[1] == Ls[0]["wo"].data_ptr())
    assert steps >= 2 and all(16 < d[0] <= 64 for d in res + nrm)   # decode steps (padded)
    for i, L in enumerate(Ls):
        last, first = i + 1 == len(Ls), i == 0
        assert sum(d[1:] == (L["wo"].data_ptr(), L["post_norm"].data_ptr()) for d in res) == steps
        nxt = None if last else Ls[i + 1]["in_norm"].data_ptr()
        assert sum(d[1:] == (L["wd"].data_ptr(), nxt) for d in res) == (0 if last else steps)
        assert sum(d[1] == L["wgu"].data_ptr() for d in nrm) == steps
        assert sum(d[1] == L["wqkv"].data_ptr() for d in nrm) == (0 if first else steps)
    assert len(res) == len(nrm) == steps * (2 * len(Ls) - 1)
    two_tiles = {k: dict(d, o_proj=(2, 1)) for k, d in runner_mod.WG_GEMM.items()}
    for attrs in (dict(wg_gemm=two_tiles), dict(fuse_swiglu=False), dict(invariant=True)):
        _, got = run(**attrs)
        assert not any(k in ("skinny_wg_residual", "skinny_wg_norm") for k, _ in launches), attrs
        if "invariant" not in attrs:
            assert got == want, attrs
    run(n=12)                                           # 12 rows: not the warpgroup kernel's
    assert not any(k in ("skinny_wg_residual", "skinny_wg_norm") for k, _ in launches)
    eng = opt_engine()                                  # a runner with a row-parallel sum (tensor parallelism's hook)
    eng.runner.wg_gemm = {k: dict(d) for k, d in runner_mod.WG_GEMM.items()}
    eng.runner.__class__ = type("SummingRunner", (runner_mod.CudaRunner,), {"_reduce": lambda self, x: x})
    launches.clear()
    assert _turns(eng, prompts, sps) == want
    assert not any(k in ("skinny_wg_residual", "skinny_wg_norm") for k, _ in launches)


def _wg_rollout(opt_engine, launches, **attrs):
    """20 short sequences of 3 greedy tokens (decode steps of 20 rows) on an engine with every role on the warpgroup
    kernel (``runner.WG_GEMM``) and ``attrs`` set on its runner, the launch log cleared first: (engine, turns)."""
    from optimized import runner as runner_mod

    prompts = [[(5 * i + j) % 512 for j in range(3 + i % 3)] for i in range(20)]
    sps = [reference.SamplingParams(max_tokens=3, stop_token_ids=(), logprobs=True)] * 20
    launches.clear()
    eng = opt_engine()
    eng.runner.wg_gemm = {k: dict(d) for k, d in runner_mod.WG_GEMM.items()}
    for k, v in attrs.items():
        setattr(eng.runner, k, v)
    return eng, _turns(eng, prompts, sps)


def test_spread_fold_reaches_every_warpgroup_gemm(opt_engine, launches):
    """``wg_spread_fold`` (on by default) hands ``spread=True`` to every warpgroup-kernel launch of a decode step
    (the four layer GEMMs, folded or not, and the LM head) and changes no token or logprob against the gathered
    fold; off, no launch has it."""
    assert opt_engine().runner.wg_spread_fold is True
    _, want = _wg_rollout(opt_engine, launches, wg_spread_fold=False)
    assert any(k == "skinny_wg" for k, _ in launches) and not any(k == "skinny_wg_spread" for k, _ in launches)
    for attrs in (dict(), dict(fuse_norm_gemm=False)):
        assert _wg_rollout(opt_engine, launches, **attrs)[1] == want, attrs
        wg = [d[:2] for k, d in launches if k == "skinny_wg"]
        assert wg and wg == [d for k, d in launches if k == "skinny_wg_spread"], attrs


def test_wg_stages_reach_the_layer_gemms(opt_engine, launches):
    """``wg_stages = {role: 4}`` hands ``stages=4`` to that role's GEMMs of a 17-32-row decode step on the warpgroup
    kernel (its configurations of 4 stages are built at 32 x rows for one tile and 1 or 4 CTAs a unit), folded or
    not, and to no other (the LM head's is not a layer role); no token or logprob changes. Empty (the default) no
    launch names stages; a stage count with no configuration for a GEMM leaves that GEMM on its default
    (``runner._wg_stages``)."""
    eng, want = _wg_rollout(opt_engine, launches)
    assert eng.runner.wg_stages == {} and not any(k == "skinny_wg_stages" for k, _ in launches)
    keys = {"qkv": "wqkv", "o_proj": "wo", "gate_up": "wgu", "down": "wd"}
    for roles in (("qkv", "o_proj", "gate_up", "down"), ("o_proj", "gate_up", "down"), ("down",)):
        for fold in (True, False):
            eng, got = _wg_rollout(opt_engine, launches, wg_stages=dict.fromkeys(roles, 4), fuse_norm_gemm=fold)
            assert got == want, (roles, fold)
            mine = {x[keys[r]].data_ptr() for x in eng.runner.layers for r in roles}   # this engine's weights
            layer = [d[:2] for k, d in launches if k == "skinny_wg" and d[1] in mine]
            staged = [d for k, d in launches if k == "skinny_wg_stages"]
            assert layer and [d[:2] for d in staged] == layer and {d[2] for d in staged} == {4}, (roles, fold)
    assert eng.runner._wg_stages("down", 20, 1, 2) is None and eng.runner._wg_stages("down", 40, 1, 4) is None
    assert eng.runner._wg_stages("down", 20, 1, 4) == 4 and eng.runner._wg_stages("down", 20, 1, 1, fold=True) == 4
    assert eng.runner._wg_stages("qkv", 20, 1, 1) is None                   # a role not named


def test_fused_rope_host_side_equals_unfused(opt_engine, launches):
    """Fused RoPE caches pre-RoPE keys (qk_norm_rope with rotate_k=False) and hands the fp32 tables to
    every attention launch; with the stand-ins' rotation the results equal the unfused engine's bitwise."""
    runs = []
    for fused in (False, True):
        launches.clear()
        runs.append(rope_rollout(opt_engine(rope_in_attention=fused, split_kv="fixed:5")))
        assert {d for k, d in launches if k == "qk_norm_rope"} == {not fused}
        attn = [d if k == "paged_prefill" else d[4] for k, d in launches if k in ("paged_prefill", "split_kv_decode")]
        assert attn and set(attn) == {fused}, "every attention launch must (not) get the RoPE tables"
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


def test_decode_qk_norm_rope_goes_into_the_attention_launch(opt_engine, launches):
    """A decode step's qk_norm_rope and KV store run in its attention launch (``split_kv_decode``'s
    ``norm_rope``); prefill keeps its own qk_norm_rope launch, and so does a decode step with the fusion off,
    with fused RoPE (a cache of pre-RoPE keys) or of more rows than ``fuse_qk_max_rows``. With the stand-ins
    the tokens and logits equal the two-launch engine's bitwise."""
    runs = []
    for fuse, kw in ((False, {}), (True, {}), (True, {"rope_in_attention": True}), (True, {"max_rows": 0})):
        launches.clear()
        rows = kw.pop("max_rows", 16)
        eng = opt_engine(split_kv="fixed:5", **kw)
        eng.runner.fuse_qk_attention = fuse
        eng.runner.fuse_qk_max_rows = rows                # (0: every decode step is larger than the limit)
        runs.append(rope_rollout(eng))
        decode = [d for k, d in launches if k == "split_kv_decode"]
        prefills = sum(k == "paged_prefill" for k, _ in launches)
        norms = sum(k == "qk_norm_rope" for k, _ in launches)
        one = fuse and not kw and rows > 0
        assert decode and prefills and {d[5] for d in decode} == {one}, (fuse, kw)
        assert norms == prefills + (0 if one else len(decode)), (fuse, kw, norms, prefills, len(decode))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    assert runs[2][0] == runs[1][0] and torch.equal(runs[2][1], runs[1][1])
    assert runs[3][0] == runs[1][0] and torch.equal(runs[3][1], runs[1][1])


def test_decode_attention_after_its_own_store_reads_early(opt_engine, launches):
    """A decode step whose qk_norm_rope (and KV store) is its own launch attends with ``early=True``: its
    first tiles' cached rows are read before the wait for that launch, which the stand-in holds to its
    contract (the launch just before is qk_norm_rope, whose store wrote at most each row's last key); with
    ``early_attention_trigger`` that qk_norm_rope lets it start before its own wait, and never before a late
    launch. The fused qk launch, prefill, and batch-invariant prefill rows (``row_seq``) never do;
    ``early_attention`` off turns it off. Tokens and logits are the same every way."""
    runs = []
    for early, trigger, fuse, invariant in ((False, True, False, False), (True, False, False, False),
                                            (True, True, False, False), (True, True, True, False),
                                            (True, True, False, True), (False, False, False, True)):
        launches.clear()
        eng = opt_engine(split_kv="fixed:5", batch_invariant=invariant)
        eng.runner.fuse_qk_attention = fuse
        eng.runner.early_attention, eng.runner.early_attention_trigger = early, trigger
        runs.append(rope_rollout(eng))
        calls = [d for k, d in launches if k == "split_kv_decode"]
        decode = [d for d in calls if not d[0]]
        assert decode and {d[6] for d in decode} == {early and not fuse}, (early, fuse, invariant)
        # qk_norm_rope lets the attention start before its own wait only before an early one, when asked
        assert {d[7] for d in decode} == {early and trigger and not fuse}, (early, trigger, fuse)
        assert all(not d[6] and not d[7] for d in calls if d[0] or d[5]), "early on a row_seq or norm_rope launch"
        if invariant:
            assert any(d[0] for d in calls), "no batch-invariant prefill row through split_kv_decode"
    for toks, logits in runs[1:4]:
        assert toks == runs[0][0] and torch.equal(logits, runs[0][1])
    assert runs[4][0] == runs[5][0] and torch.equal(runs[4][1], runs[5][1])


def test_the_embedding_and_first_norm_are_one_launch(opt_engine, launches):
    """Every step (prefill and decode) embeds its ids and takes the first layer's RMSNorm in one launch
    (``ops.embed_rmsnorm``) unless ``fuse_embed_norm`` is off; the tokens and logits are the same."""
    runs = []
    for fuse in (False, True):
        launches.clear()
        eng = opt_engine(split_kv="fixed:5")
        eng.runner.fuse_embed_norm = fuse
        runs.append(rope_rollout(eng))
        fused = [d for k, d in launches if k == "embed_rmsnorm"]
        attn = sum(k in ("paged_prefill", "split_kv_decode") for k, _ in launches)
        steps = attn // TINY.num_hidden_layers
        assert steps > 1 and len(fused) == (steps if fuse else 0), (fuse, len(fused), steps)
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


def test_optimized_accepts_any_block_size_and_head_dim_16():
    from optimized.engine import shape_problems
    for bs in (1, 3, 5, 16, 24):
        assert shape_problems(TINY, bs) == []
    import dataclasses
    assert shape_problems(dataclasses.replace(TINY, head_dim=16), 4) == []
    assert "head_dim 8" in shape_problems(dataclasses.replace(TINY, head_dim=8), 4)[0]


def test_optimized_defaults_auto_split_but_fixed_under_batch_invariance():
    """The optimized engine sizes splits with ``auto`` by default; batch-invariant mode, which forbids
    ``auto``, gets ``fixed:256`` unless the caller names a policy (and naming ``auto`` there stays an error)."""
    from optimized.engine import INVARIANT_SPLIT_KV, engine_config
    assert engine_config().split_kv == "auto"
    assert engine_config(split_kv="fixed:64").split_kv == "fixed:64"
    assert engine_config(batch_invariant=True).split_kv == INVARIANT_SPLIT_KV == "fixed:256"
    assert engine_config(batch_invariant=True, split_kv="disabled").split_kv == "disabled"
    with pytest.raises(reference.ConfigError):
        engine_config(batch_invariant=True, split_kv="auto")


def test_canonical_gemm_rows_route_default_steps_to_ops_gemm(opt_engine, launches):
    """``canonical_gemm_min_m`` .. ``canonical_gemm_max_m`` (off on the CPU; ``CANONICAL_GEMM_ROWS`` where the wide
    kernel can launch): in default mode the GEMMs of that many rows run through ``ops.gemm`` -- gate/up with its
    SwiGLU epilogue (``fuse_swiglu``), the LM head in fp32 -- ahead of the skinny kernels; other steps keep the
    rules. The stand-ins' products are the reference's, so the rollout's tokens are the engine's without it."""
    from optimized.runner import CANONICAL_GEMM_ROWS
    assert CANONICAL_GEMM_ROWS == (9, 16)
    prompts = [[(3 * i + j) % 512 for j in range(2 + i % 4)] for i in range(6)]
    sps = [reference.SamplingParams(max_tokens=3, stop_token_ids=())] * 6
    eng = opt_engine()
    assert eng.runner.canonical_gemm_max_m == 0
    want = _rollout(eng, prompts, sps, turns=2)
    assert not {"gemm", "gemm_swiglu"} & {k for k, _ in launches}, "off by default"
    launches.clear()
    eng = opt_engine()
    eng.runner.canonical_gemm_max_m = 8
    assert _rollout(eng, prompts, sps, turns=2) == want
    rows = {k: sorted({m for kk, m in launches if kk == k}) for k in ("gemm", "gemm_swiglu")}
    assert rows["gemm"] and rows["gemm_swiglu"] and max(rows["gemm"] + rows["gemm_swiglu"]) <= 8, rows
    assert 8 in rows["gemm_swiglu"], "the decode steps (6 sequences, padded to the 8-row bucket)"
    skinny = [d if isinstance(d, int) else d[0] for k, d in launches if k.startswith("skinny")]
    assert all(m > 8 for m in skinny), ("no skinny kernel takes a step the switch covers", skinny)
    launches.clear()
    eng = opt_engine()
    eng.runner.canonical_gemm_min_m, eng.runner.canonical_gemm_max_m = 9, 32      # the prefill steps, not the decode
    assert _rollout(eng, prompts, sps, turns=2) == want
    rows = sorted({m for k, m in launches if k in ("gemm", "gemm_swiglu")})
    assert rows and min(rows) >= 9 and max(rows) <= 32, rows
    skinny = {d if isinstance(d, int) else d[0] for k, d in launches if k.startswith("skinny")}
    assert 8 in skinny and not any(9 <= m <= 32 for m in skinny), ("the 8-row decode steps keep the rules", skinny)


def test_step_guards_pass_the_scheduler_step_and_reject_each_broken_one():
    """``runner.check_step_metadata`` (the launch guards of DESIGN §3 on a step's numpy metadata) passes the steps the
    scheduler builds and raises ``BlockTableError`` for each broken one: two rows writing one cache slot (the same
    position twice: every other guard holds), a slot that is not its position's, a position past its sequence's
    length, a page outside the pool, a page twice in one table."""
    import dataclasses

    import numpy as np

    from optimized.runner import check_step_metadata
    from reference.config import EngineConfig
    from reference.kv_cache import BlockManager
    from reference.scheduler import Scheduler
    from reference.sequence import Sequence

    bs, pages = 4, 32
    sched = Scheduler(EngineConfig(block_size=bs, num_blocks=pages), BlockManager(pages, bs))
    for i, n in enumerate((9, 6)):
        sched.add(Sequence(i, reference.SamplingParams(), True, list(range(1, n + 1)), n))
    step = sched.schedule()
    check_step_metadata(step, pages, bs)                                     # the scheduler's step passes

    def broken(**arrays):
        return dataclasses.replace(step, **{k: np.asarray(v, dtype=getattr(step, k).dtype) for k, v in arrays.items()})

    pos, slots, tables = step.positions.copy(), step.slot_mapping.copy(), step.block_tables.copy()
    twice = broken(positions=np.r_[pos[:2], pos[1:]], slot_mapping=np.r_[slots[:2], slots[1:]],
                   q_seq_idx=np.r_[step.q_seq_idx[:2], step.q_seq_idx[1:]], input_ids=np.r_[step.input_ids[:2],
                                                                                             step.input_ids[1:]])
    off = slots.copy()
    off[3] = (pages - 1) * bs                                                 # a page no table holds
    past = pos.copy()
    past[-1] = step.seq_lens[step.q_seq_idx[-1]]
    outside = tables.copy()
    outside[0, 0] = pages
    doubled = tables.copy()
    doubled[0, 1] = doubled[0, 0]
    for what, bad, match in (("a slot written twice", twice, "same cache slot"),
                             ("a slot not its position's", broken(slot_mapping=off), "does not match"),
                             ("a position past the length", broken(positions=past), "not in its sequence"),
                             ("a page outside the pool", broken(block_tables=outside), "outside the pool"),
                             ("a page twice in a table", broken(block_tables=doubled), "appears twice")):
        with pytest.raises(reference.BlockTableError, match=match):
            check_step_metadata(bad, pages, bs)
            pytest.fail(what)


@pytest.mark.parametrize("max_tokens", [16, 256])
def test_prefill_graph_switch_pads_short_prefills_into_buckets(opt_engine, max_tokens, monkeypatch):
    """``runner.prefill_graph_max_tokens`` (on by default for an engine on graphs, off without): prefill steps of at
    most that many tokens run through the closure a CUDA graph captures (here, without graphs, run eagerly on the
    padded bucket buffers: padding rows at position -1 and slot -1, table rows of length 0, sampling rows dropped),
    the longer ones eagerly. The same tokens and logprobs as every step eager (bitwise here: the stand-in kernels compute each row
    on its own, so padding rows change nothing; on a GPU the GEMMs' row count may), over turns of fresh prompts and
    short resumes, greedy and sampled; every page is returned at the end."""
    import optimized.runner as orun

    monkeypatch.setattr(orun.ops, "allow_no_hint", True)
    sps = [reference.SamplingParams(max_tokens=5, stop_token_ids=(), logprobs=True)] * 3 + \
          [reference.SamplingParams(temperature=0.9, top_p=0.9, max_tokens=5, stop_token_ids=(), seed=s, logprobs=True)
           for s in (1, 2)]
    eager, graphed = opt_engine(), opt_engine()
    assert eager.runner.prefill_graph_max_tokens == 0                  # off without graphs
    graphed.runner.prefill_graph_max_tokens = max_tokens
    kinds: list[tuple[str, int]] = []
    run = graphed.runner.execute

    def logged(batch, ahead=None):
        kinds.append((batch.kind, batch.num_tokens))
        return run(batch, ahead)

    graphed.runner.execute = logged
    toks: dict[str, list] = {}
    lps: dict[str, list] = {}
    for name, eng in (("eager", eager), ("graphed", graphed)):
        toks[name], lps[name] = rollout_turns(eng, PROMPTS, sps)
    assert toks["graphed"] == toks["eager"], "a padded prefill bucket changed the tokens"
    print(f"prefill buckets up to {max_tokens} tokens: {graphed.runner.prefill_graph_steps} graphed steps, "
          f"keys {sorted(graphed.runner.prefill_graphs)}")
    assert lps["graphed"] == lps["eager"], "a padded prefill bucket changed the logprobs"
    prefills = [t for k, t in kinds if k == "prefill"]
    graphed_steps = [t for t in prefills if t <= max_tokens]
    assert graphed.runner.prefill_graph_steps == len(graphed_steps) > 0
    assert max_tokens == 256 or len(graphed_steps) < len(prefills), "the first turn's 63-token step goes eagerly"
    for n, r, max_len in graphed.runner.prefill_graphs:
        assert n in orun.PREFILL_GRAPH_TOKENS and r in orun.BUCKETS and max_len in orun.LEN_BUCKETS + (128,)


def test_prefill_graphs_take_short_default_mode_steps_on_one_gpu_only():
    """Which prefill steps ``_run_prefill_graph`` takes: default mode, at most ``prefill_graph_max_tokens`` tokens (and
    the largest bucket) of at most ``PREFILL_GRAPH_MAX_ROWS`` sequences, on one GPU (a TP or CP rank refuses)."""
    import types

    import optimized.runner as orun
    from optimized.parallel import ShardedCudaRunner

    r = object.__new__(ShardedCudaRunner)                 # the rule only: no weights, no devices
    r.invariant, r.prefill_graph_max_tokens = False, 256
    r.grid = types.SimpleNamespace(tp=1, cp=1)

    def step(tokens: int, seqs: int):
        return types.SimpleNamespace(num_tokens=tokens, seqs=[None] * seqs)

    assert r._prefill_graphed(step(64, 1)) and r._prefill_graphed(step(256, orun.PREFILL_GRAPH_MAX_ROWS))
    assert not r._prefill_graphed(step(257, 1)) and not r._prefill_graphed(step(64, orun.PREFILL_GRAPH_MAX_ROWS + 1))
    r.prefill_graph_max_tokens = 1000                     # the buckets end at 256 whatever the switch says
    assert not r._prefill_graphed(step(300, 1))
    r.prefill_graph_max_tokens = 0                        # off (the default without graphs)
    assert not r._prefill_graphed(step(16, 1))
    r.prefill_graph_max_tokens = 256
    r.invariant = True                                    # batch-invariant prefill is its own path
    assert not r._prefill_graphed(step(16, 1))
    r.invariant = False
    for tp, cp in ((2, 1), (1, 2)):
        r.grid = types.SimpleNamespace(tp=tp, cp=cp)
        assert not r._prefill_graphed(step(16, 1)), (tp, cp)


def test_a_decode_step_prefetches_each_layers_kv_before_its_gemms(opt_engine, launches):
    """Where it is on (``kv_prefetch_max_bytes`` above 0; off by default), a decode step of at least
    ``kv_prefetch_min_rows`` rows asks L2 for layer 0's K/V first (before its embedding) and for layer ``i + 1``'s
    right after layer ``i``'s attention, with the step's lengths and ``kv_prefetch_max_bytes``; prefill steps, smaller
    steps and a cap of 0 launch none. The tokens and logits are the same every way (the stand-in's prefetch changes
    nothing, as the kernel writes nothing)."""
    import optimized.runner as runner_mod

    n_layers = TINY.num_hidden_layers
    runs = []
    for min_rows, max_bytes in ((None, None), (1, 0), (1, 123456), (2, 1 << 20)):
        launches.clear()
        eng = opt_engine(split_kv="fixed:5")
        r = eng.runner
        if min_rows is None:                            # the default: off
            assert r.kv_prefetch_min_rows == runner_mod.KV_PREFETCH_MIN_ROWS and r.kv_prefetch_max_bytes == 0
        else:
            r.kv_prefetch_min_rows, r.kv_prefetch_max_bytes = min_rows, max_bytes
        runs.append(rope_rollout(eng))                  # one sequence: decode steps of one row
        on = min_rows == 1 and max_bytes > 0
        seq = [(k, d) for k, d in launches if k in ("embed_rmsnorm", "kv_prefetch", "split_kv_decode", "paged_prefill")]
        steps, i = 0, 0
        while i < len(seq):
            assert seq[i][0] == "embed_rmsnorm", seq[i]
            i += 1
            decode = seq[i][0] in ("kv_prefetch", "split_kv_decode")
            steps += decode
            for layer in range(n_layers):
                if decode and on:                       # this layer's K/V, with the step's lengths, then its attention
                    k, (kptr, vptr, lens, cap) = seq[i]
                    assert k == "kv_prefetch" and cap == max_bytes, seq[i]
                    assert (kptr, vptr) == (r.k_cache[layer].data_ptr(), r.v_cache[layer].data_ptr()), layer
                    assert torch.equal(lens, seq[i + 1][1][1]), "not the step's lengths"
                    i += 1
                assert seq[i][0] == ("split_kv_decode" if decode else "paged_prefill"), (layer, seq[i])
                i += 1
        assert steps >= 10 and not (not on and any(k == "kv_prefetch" for k, _ in seq)), (min_rows, max_bytes)
    for toks, logits in runs[1:]:
        assert toks == runs[0][0] and torch.equal(logits, runs[0][1])


def test_the_kv_prefetch_goes_on_a_side_stream_the_step_joins(opt_engine, launches, monkeypatch):
    """On the GPU each K/V prefetch goes on the runner's ``prefetch_stream``, which first waits for everything queued
    on the step's stream (the attention before, the step's upload); the step's stream waits for the side stream once,
    after its last layer, so no kernel of the chain waits for a prefetch (it lasts until its pages are in L2) and the
    step still ends after them. Stand-in streams record the waits and the stream each launch goes on."""
    import contextlib

    import optimized.runner as runner_mod

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other) -> None:
            launches.append(("wait", (self.name, other.name)))

    main, side = Stream("main"), Stream("side")

    @contextlib.contextmanager
    def on(stream):
        launches.append(("on", stream.name))
        yield
        launches.append(("off", stream.name))

    eng = opt_engine(split_kv="fixed:5")
    want = rope_rollout(eng)
    eng = opt_engine(split_kv="fixed:5")
    eng.runner.kv_prefetch_min_rows, eng.runner.kv_prefetch_max_bytes = 1, 50 << 20
    monkeypatch.setattr(runner_mod.CudaRunner, "prefetch_stream", property(lambda self: side))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "stream", on)
    launches.clear()
    got = rope_rollout(eng)
    assert got[0] == want[0] and torch.equal(got[1], want[1])
    seq = [(k, d) for k, d in launches if k in ("wait", "on", "off", "kv_prefetch", "split_kv_decode", "embed_rmsnorm")]
    n_layers = TINY.num_hidden_layers
    pf = [i for i, (k, _) in enumerate(seq) if k == "kv_prefetch"]
    assert pf and len(pf) % n_layers == 0
    for i in pf:                                        # fork from the step's stream, launch on the side stream
        assert seq[i - 2:i + 2] == [("wait", ("side", "main")), ("on", "side"), seq[i], ("off", "side")], seq[i - 2:i + 2]
    joins = [i for i, (k, d) in enumerate(seq) if (k, d) == ("wait", ("main", "side"))]
    assert len(joins) == len(pf) // n_layers, "one join a decode step"
    for step, j in enumerate(joins):                    # after the step's last prefetch and last attention
        last = pf[(step + 1) * n_layers - 1]
        assert last < j and seq[j - 1][0] == "split_kv_decode", seq[j - 1]
        assert all(k != "kv_prefetch" for k, _ in seq[last + 2:j]), "a prefetch after the step's last layer"
