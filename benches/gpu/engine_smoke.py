"""GPU smoke check of the optimized engine against the reference, section by section.

Run on a CUDA machine from the repo root: ``python benches/gpu/engine_smoke.py``. Every section
runs even if an earlier one failed; the exit code is non-zero if any failed.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
import traceback

import torch

import optimized
import reference
from reference.config import named_config
from reference.weights import random_weights

FAILED: list[str] = []


def section(fn):
    name = fn.__name__
    t = time.perf_counter()
    try:
        fn()
        print(f"[ ok ] {name} ({time.perf_counter() - t:.1f} s)", flush=True)
    except Exception:  # noqa: BLE001 - report and go on
        FAILED.append(name)
        print(f"[FAIL] {name}\n{traceback.format_exc()}", flush=True)
    return fn


CFG = named_config("tiny")
W = random_weights(CFG, 0)
RNG = random.Random(0)
PROMPTS = [[RNG.randrange(CFG.vocab_size) for _ in range(n)] for n in (5, 16, 33, 70)]
GREEDY = reference.SamplingParams(max_tokens=12, stop_token_ids=())
KW = dict(block_size=16, max_model_len=1024, num_blocks=512, split_kv="fixed:32")


def rollout(eng, sp, turns=4):
    sids = [eng.rollout_add(p, sp) for p in PROMPTS]
    ctx = {s: list(p) for s, p in zip(sids, PROMPTS)}
    per_turn = []
    for t in range(turns):
        outs = eng.rollout_run_turns()
        per_turn.append({s: outs[s].token_ids for s in sids})
        for s in sids:
            ctx[s] += outs[s].token_ids
            if t + 1 < turns:
                obs = [(s * 13 + t * 7 + i) % CFG.vocab_size for i in range([0, 1, 15, 16, 17, 49][(s + t) % 6])]
                eng.rollout_continue(s, obs)
                ctx[s] += obs
    for s in sids:
        eng.rollout_finish(s)
    assert eng.num_free_blocks == eng.num_blocks, "blocks leaked"
    return per_turn, ctx


@section
def build_and_score():
    opt = optimized.Engine.from_state_dict(CFG, W, **KW)
    ref32 = reference.Engine.from_state_dict(CFG, W, **{**KW, "dtype": "float32"})
    ref16 = reference.Engine.from_state_dict(CFG, W, **{**KW, "dtype": "bfloat16"})
    ids = PROMPTS[3] + PROMPTS[2]
    lo, l32, l16 = opt.score(ids), ref32.score(ids), ref16.score(ids)
    e_opt, e_ref = (lo - l32).abs(), (l16 - l32).abs()
    bound = 2 * e_ref.max().item() + 2 ** -8 * l32.abs().max().item()
    print(f"  score: optimized err max {e_opt.max():.4g} mean {e_opt.mean():.4g}; reference-bf16 err max "
          f"{e_ref.max():.4g} mean {e_ref.mean():.4g}; bound {bound:.4g}")
    assert torch.isfinite(lo).all()
    assert e_opt.max().item() <= bound and e_opt.mean().item() <= 2 * e_ref.mean().item() + 2 ** -8 * l32.abs().mean().item()


@section
def greedy_multi_turn_equals_single_shot():
    opt = optimized.Engine.from_state_dict(CFG, W, **KW)
    per_turn, _ = rollout(opt, GREEDY)
    # turn k of a sequence == generate over its context before turn k (same engine)
    opt2 = optimized.Engine.from_state_dict(CFG, W, **KW)
    per_turn2, ctx = rollout(opt2, GREEDY, turns=1)
    assert per_turn2[0] == per_turn[0], "first turn differs between two identical engines"
    same = total = 0
    opt3 = optimized.Engine.from_state_dict(CFG, W, **KW)
    sids = [opt3.rollout_add(p, GREEDY) for p in PROMPTS]
    contexts = {s: list(p) for s, p in zip(sids, PROMPTS)}
    for _ in range(3):
        outs = opt3.rollout_run_turns()
        single = opt3.generate([contexts[s] for s in sids], GREEDY)
        for s, g in zip(sids, single):
            total += 1
            same += outs[s].token_ids == g
            contexts[s] += outs[s].token_ids + [1, 2, 3]
            opt3.rollout_continue(s, [1, 2, 3])
    print(f"  multi-turn == single-shot on {same}/{total} turns")
    assert same >= 0.75 * total


@section
def greedy_vs_reference():
    opt = optimized.Engine.from_state_dict(CFG, W, **KW)
    ref = reference.Engine.from_state_dict(CFG, W, **{**KW, "dtype": "float32"})
    a, _ = rollout(opt, GREEDY, turns=2)
    b, _ = rollout(ref, GREEDY, turns=2)
    agree = sum(a[t][s] == b[t][s] for t in range(2) for s in a[t])
    first = sum(a[0][s][:4] == b[0][s][:4] for s in a[0])
    print(f"  optimized vs reference fp32: {agree}/{2 * len(PROMPTS)} turns identical, first 4 tokens {first}/{len(PROMPTS)}")
    assert first >= len(PROMPTS) - 1


@section
def sampling_matches_reference():
    sp = reference.SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=8, stop_token_ids=(), seed=3)
    opt = optimized.Engine.from_state_dict(CFG, W, **KW)
    ref = reference.Engine.from_state_dict(CFG, W, **{**KW, "dtype": "float32"})
    a = opt.generate(PROMPTS, sp)
    b = ref.generate(PROMPTS, sp)
    first = sum(x[0] == y[0] for x, y in zip(a, b))
    print(f"  sampled first tokens equal {first}/{len(a)}; full sequences equal {sum(x == y for x, y in zip(a, b))}/{len(a)}")
    assert first >= len(a) - 1


@section
def graphs_equal_eager():
    g = optimized.Engine.from_state_dict(CFG, W, **KW)
    e = optimized.Engine.from_state_dict(CFG, W, use_graphs=False, **KW)
    assert rollout(g, GREEDY, turns=2)[0] == rollout(e, GREEDY, turns=2)[0]


@section
def prefill_graphs_match_eager():
    """``runner.prefill_graph_max_tokens`` (on by default on graphs): the short prefill steps replayed from the
    graphs of padded buckets give the eager steps' tokens. bf16: the GEMMs see the bucket's row count, so a near tie
    may move; the share of identical turns is printed, every sequence's first 4 tokens asserted."""
    g = optimized.Engine.from_state_dict(CFG, W, **KW)
    assert g.runner.prefill_graph_max_tokens == 256, "on by default on graphs"
    e = optimized.Engine.from_state_dict(CFG, W, **KW)
    e.runner.prefill_graph_max_tokens = 0
    a, _ = rollout(g, GREEDY)
    b, _ = rollout(e, GREEDY)
    agree = sum(a[t][s] == b[t][s] for t in range(len(a)) for s in a[t])
    first = sum(a[0][s][:4] == b[0][s][:4] for s in a[0])
    print(f"  prefill graphs: {g.runner.prefill_graph_steps} graphed steps, keys {sorted(g.runner.prefill_graphs)}; "
          f"{agree}/{len(a) * len(PROMPTS)} turns identical to eager, first 4 tokens {first}/{len(PROMPTS)}")
    assert g.runner.prefill_graph_steps > 0 and first == len(PROMPTS)


@section
def lookahead_changes_nothing():
    """The lookahead step (optimized/lookahead.py) on the GPU: multi-turn sampled rollouts whose turns end
    at scattered steps (stop tokens) give the same tokens and logprobs, bitwise, with it and without."""
    stops = tuple(range(0, CFG.vocab_size, 13))
    sps = [reference.SamplingParams(temperature=1.0, seed=i, max_tokens=24, stop_token_ids=stops) for i in range(4)]

    def run(on: bool):
        eng = optimized.Engine.from_state_dict(CFG, W, **KW)
        eng.runner.lookahead = on
        sids = [eng.rollout_add(p, sp) for p, sp in zip(PROMPTS, sps)]
        got = []
        for t in range(4):
            outs = eng.rollout_run_turns()
            got.append([(outs[s].token_ids, outs[s].logprobs, outs[s].stop_reason) for s in sids])
            for s in sids:
                if t < 3:
                    eng.rollout_continue(s, [(s * 5 + t + i) % CFG.vocab_size for i in range(1 + (s + t) % 9)])
        for s in sids:
            eng.rollout_finish(s)
        return got, eng.runner.lookahead_used, eng.runner.lookahead_dropped

    on, used, dropped = run(True)
    off, used_off, _ = run(False)
    print(f"  lookahead steps used {used}, dropped {dropped}")
    assert on == off, "the lookahead changed a token or a logprob"
    assert used > 0 and dropped > 0 and used_off == 0


@section
def pressure_swap_and_groups():
    small = optimized.Engine.from_state_dict(CFG, W, **{**KW, "num_blocks": 20, "swap_space": 8})
    big = optimized.Engine.from_state_dict(CFG, W, **KW)
    a, _ = rollout(small, GREEDY, turns=3)
    b, _ = rollout(big, GREEDY, turns=3)
    s = small.scheduler
    print(f"  swaps {s.swaps} evictions {s.evictions} preemptions {s.preemptions}; "
          f"turns equal {sum(a[t][q] == b[t][q] for t in range(3) for q in a[t])}/{3 * len(PROMPTS)}")
    grp = optimized.Engine.from_state_dict(CFG, W, **KW)
    sps = [reference.SamplingParams(temperature=1.0, max_tokens=6, stop_token_ids=(), seed=i) for i in range(8)]
    sids = grp.rollout_add_group(PROMPTS[2] + PROMPTS[1][:15], sps)      # 48 tokens: block-aligned, copy-on-write
    outs = grp.rollout_run_turns()
    plain = optimized.Engine.from_state_dict(CFG, W, **KW)
    psids = [plain.rollout_add(PROMPTS[2] + PROMPTS[1][:15], sp) for sp in sps]
    pouts = plain.rollout_run_turns()
    eq = sum(outs[x].token_ids == pouts[y].token_ids for x, y in zip(sids, psids))
    print(f"  group sharing: {eq}/8 equal to unshared; blocks {grp.num_blocks - grp.num_free_blocks} vs "
          f"{plain.num_blocks - plain.num_free_blocks}")
    assert eq >= 7


@section
def weight_update_in_place():
    eng = optimized.Engine.from_state_dict(CFG, W, **KW)
    sid = eng.rollout_add(PROMPTS[3], GREEDY)
    first = eng.rollout_run_turns()[sid]
    new = random_weights(CFG, 1)
    assert eng.update_weights(new, recompute_kv=True) == 1
    eng.rollout_continue(sid, [1, 2, 3])
    second = eng.rollout_run_turns()[sid]
    fresh = optimized.Engine.from_state_dict(CFG, new, **KW)
    ref = fresh.generate([PROMPTS[3] + first.token_ids + [1, 2, 3]], GREEDY)[0]
    print(f"  after update_weights(recompute_kv=True): first tokens {second.token_ids[:4]} vs fresh engine {ref[:4]}")
    assert second.weights_version == 1 and second.token_ids[:2] == ref[:2]


def _target_logits(eng, target, mates, obs):
    """Two turns of ``target`` after ``mates``: (its logits rows, its tokens, its whole context)."""
    eng.record_logits()
    sp = reference.SamplingParams(max_tokens=6, stop_token_ids=())
    for m in mates:
        eng.rollout_add(m, sp)
    sid = eng.rollout_add(target, sp)
    first = eng.rollout_run_turns()
    for s in first:
        eng.rollout_continue(s, obs if s == sid else obs[: len(obs) // 3])
    second = eng.rollout_run_turns()
    return torch.stack(eng.logit_log[sid]), first[sid].token_ids + second[sid].token_ids, target + first[sid].token_ids + obs


def _invariance(cfg, weights, kw, n_mates=(7, 40)):
    target = [RNG.randrange(cfg.vocab_size) for _ in range(45)]
    obs = [RNG.randrange(cfg.vocab_size) for _ in range(19)]
    alone, toks, ctx = _target_logits(optimized.Engine.from_state_dict(cfg, weights, **kw), target, [], obs)
    for n in n_mates:
        mates = [[RNG.randrange(cfg.vocab_size) for _ in range(RNG.randrange(1, 300))] for _ in range(n)]
        crowd, toks_c, _ = _target_logits(optimized.Engine.from_state_dict(cfg, weights, **kw), target, mates, obs)
        diff = (crowd - alone).abs().max().item()
        print(f"  {n} batch mates: tokens equal {toks_c == toks}, logits max diff {diff:.3g}")
        assert toks_c == toks and torch.equal(crowd, alone), "logits changed with batch mates"
    single = optimized.Engine.from_state_dict(cfg, weights, **kw)
    single.record_logits()
    single.generate([ctx], reference.SamplingParams(max_tokens=6, stop_token_ids=()))
    one = torch.stack(single.logit_log[0])
    print(f"  single-shot prefill vs multi-turn resume: max diff {(one - alone[6:]).abs().max().item():.3g}")
    assert torch.equal(one, alone[6:]), "multi-turn resume differs from single-shot prefill"


@section
def batch_invariant_bitwise_tiny():
    _invariance(CFG, W, {**KW, "batch_invariant": True, "split_kv": "fixed:16"})
    _invariance(CFG, W, {**KW, "batch_invariant": True, "split_kv": "disabled"}, n_mates=(9,))


@section
def batch_invariant_bitwise_qwen3_06b():
    cfg = dataclasses.replace(named_config("qwen3-0.6b"), tie_word_embeddings=False)
    w = random_weights(cfg, 0, dtype=torch.bfloat16)
    _invariance(cfg, w, dict(block_size=16, max_model_len=1024, num_blocks=2048, batch_invariant=True,
                             split_kv="fixed:64"))


@section
def fused_rope_equals_unfused():
    runs = []
    for fused in (False, True):
        eng = optimized.Engine.from_state_dict(CFG, W, **{**KW, "rope_in_attention": fused})
        logits, toks, _ = _target_logits(eng, PROMPTS[3], PROMPTS[:2], [5, 6, 7, 8, 9])
        runs.append((toks, logits, eng.score(PROMPTS[3] + PROMPTS[2])))
    (t0, l0, s0), (t1, l1, s1) = runs
    print(f"  fused vs unfused: tokens equal {t0 == t1}, logits max diff {(l0 - l1).abs().max().item():.3g}, "
          f"score max diff {(s0 - s1).abs().max().item():.3g}")
    assert t0 == t1 and torch.equal(l0, l1) and torch.equal(s0, s1)


@section
def qwen3_06b_decode_speed():
    cfg = named_config("qwen3-0.6b")
    t = time.perf_counter()
    eng = optimized.Engine.from_pretrained("qwen3-0.6b", max_model_len=2048, num_blocks=4096)
    print(f"  built in {time.perf_counter() - t:.1f} s")
    for B in (1, 32):
        prompts = [[RNG.randrange(cfg.vocab_size) for _ in range(128)] for _ in range(B)]
        sp = reference.SamplingParams(max_tokens=64, stop_token_ids=())
        eng.generate(prompts, sp)                                  # warm-up and graph capture
        torch.cuda.synchronize()
        t = time.perf_counter()
        eng.generate(prompts, sp)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        print(f"  qwen3-0.6b batch {B}: {B * 64 / dt:.0f} tokens/s ({dt / 64 * 1e3:.2f} ms per step incl. prefill)")


print("FAILED:", FAILED if FAILED else "none")
sys.exit(1 if FAILED else 0)
