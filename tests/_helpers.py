"""Shared helpers of the reference test suite (imported by the tests and by conftest.py)."""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field

import torch

from reference import Engine, ModelConfig, SamplingParams, named_config
from reference.oracle import oracle_generate
from reference.weights import random_weights

TINY: ModelConfig = named_config("tiny")

def examples(n: int) -> int:
    """Hypothesis example count: ``n`` in CI, 10x under ``HYPOTHESIS_PROFILE=turnkv-explore``."""
    return n * (10 if os.environ.get("HYPOTHESIS_PROFILE") == "turnkv-explore" else 1)


#: one bf16 rounding step relative to a magnitude (8 significant bits)
BF16_EPS = 2.0 ** -8

_WEIGHTS: dict[tuple, dict[str, torch.Tensor]] = {}


def tiny_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    key = ("tiny", seed)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = random_weights(TINY, seed)
    return _WEIGHTS[key]


def tiny_engine(**kw) -> Engine:
    """The tiny model (seeded weights) with a small pool unless told otherwise."""
    kw.setdefault("num_blocks", 128)
    kw.setdefault("max_model_len", 256)
    kw.setdefault("block_size", 8)
    return Engine.from_state_dict(TINY, tiny_weights(0), **kw)


def rand_ids(rng: random.Random, n: int, vocab: int = TINY.vocab_size) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------- batch invariance, fused RoPE

def target_logits(eng, target: list[int], mates: list[list[int]], obs: list[int], mates_first: bool = True):
    """Two greedy turns of ``target`` among ``mates`` (added before or after it; they get half of ``obs``).
    Returns the target's logits rows, its tokens of both turns and its whole context before turn 2's tokens."""
    eng.record_logits()
    sp = SamplingParams(max_tokens=5, stop_token_ids=())
    if mates_first:
        for m in mates:
            eng.rollout_add(m, sp)
    sid = eng.rollout_add(target, sp)
    if not mates_first:
        for m in mates:
            eng.rollout_add(m, sp)
    first = eng.rollout_run_turns()
    for s in first:
        eng.rollout_continue(s, obs if s == sid else obs[: len(obs) // 2])
    second = eng.rollout_run_turns()
    return torch.stack(eng.logit_log[sid]), first[sid].token_ids + second[sid].token_ids, target + first[sid].token_ids + obs


def rope_rollout(eng) -> tuple[list[int], torch.Tensor]:
    """The fused-vs-unfused RoPE workload: a 30-token prompt, 6 greedy tokens, 3 observed, 6 more.
    Returns the tokens of both turns and their logits rows."""
    eng.record_logits()
    sp = SamplingParams(max_tokens=6, stop_token_ids=())
    sid = eng.rollout_add(list(range(10, 40)), sp)
    first = eng.rollout_run_turns()[sid]
    eng.rollout_continue(sid, [1, 2, 3])
    second = eng.rollout_run_turns()[sid]
    return first.token_ids + second.token_ids, torch.stack(eng.logit_log[sid])


# ----------------------------------------------------------------------------- rollouts

@dataclass
class SeqRecord:
    sid: int
    prompt: list[int]
    sp: SamplingParams
    contexts: list[list[int]] = field(default_factory=list)    # context before each turn
    outputs: list = field(default_factory=list)                # TurnOutput of each turn
    observations: list[list[int]] = field(default_factory=list)
    trajectory: object = None


def drive(engine: Engine, specs, turns: int, obs_fn, finish: bool = True, check_pool=None) -> list[SeqRecord]:
    """Run an agentic rollout.

    ``specs``: list of ``(prompt, sp)``; ``obs_fn(seq_index, turn_index, turn_tokens) -> list[int]``.
    Every active sequence must produce exactly one turn per ``rollout_run_turns``.
    ``check_pool(engine)`` (optional) runs after every call that moves blocks.
    """
    recs = []
    for prompt, sp in specs:
        recs.append(SeqRecord(engine.rollout_add(prompt, sp), list(prompt), sp))
    ctx = {r.sid: list(r.prompt) for r in recs}
    active = {r.sid: i for i, r in enumerate(recs)}
    for k in range(turns):
        outs = engine.rollout_run_turns()
        if check_pool:
            check_pool(engine)
        assert set(outs) == set(active), f"turn {k}: outputs for {sorted(outs)}, active {sorted(active)}"
        for sid, i in list(active.items()):
            out = outs[sid]
            r = recs[i]
            assert out.turn_index == k, f"seq {sid}: turn_index {out.turn_index}, expected {k}"
            assert len(out.token_ids) >= 1
            r.contexts.append(list(ctx[sid]))
            r.outputs.append(out)
            ctx[sid] += out.token_ids
            if out.finished:
                assert out.stop_reason == "context_limit", f"agentic seq {sid} finished with {out.stop_reason}"
                assert engine.state(sid) == "finished"
                del active[sid]
            elif k + 1 < turns:
                assert engine.state(sid) == "paused"
                obs = list(obs_fn(i, k, list(out.token_ids)))
                obs = obs[:max(0, engine.max_model_len - len(ctx[sid]) - 1)]   # stay inside the context
                engine.rollout_continue(sid, obs)
                r.observations.append(obs)
                ctx[sid] += obs
    if finish:
        for r in recs:
            r.trajectory = engine.rollout_finish(r.sid)
            assert r.trajectory.token_ids == ctx[r.sid], f"seq {r.sid}: trajectory tokens != prompt+turns+observations"
        if check_pool:
            check_pool(engine)
    return recs


def rollout_turns(eng, prompts: list[list[int]], sps: list[SamplingParams], turns: int = 3) -> tuple[list, list]:
    """Multi-turn rollouts of ``prompts`` on ``eng`` with short observations between turns (0-6 tokens), then
    finished, every page returned: each turn's tokens per sequence, and every logprob in order."""
    sids = [eng.rollout_add(p, sp) for p, sp in zip(prompts, sps)]
    toks, lps = [], []
    for t in range(turns):
        outs = eng.rollout_run_turns()
        toks.append([outs[s].token_ids for s in sids])
        lps += [lp for s in sids for lp in outs[s].logprobs]
        if t + 1 < turns:
            for s in sids:
                eng.rollout_continue(s, [(s * 11 + t * 5 + i) % 512 for i in range((s + t) % 7)])
    for s in sids:
        eng.rollout_finish(s)
    assert eng.num_free_blocks == eng.num_blocks
    return toks, lps


def check_pool_accounting(engine: Engine) -> None:
    """Pages of live sequences are disjoint, and with the free list they make up the whole pool."""
    snap = engine.snapshot()
    used: list[int] = []
    for sid, s in snap["seqs"].items():
        table = s[3]
        used += table
        state, tokens, num_cached = s[0], s[1], s[2]
        if state == "paused":
            assert num_cached in (0, len(tokens) - 1), f"paused seq {sid}: num_cached {num_cached} of {len(tokens)}"
        swapped = getattr(engine._seqs[sid], "swapped", 0)          # KV held in host swap space
        if num_cached and not swapped:
            assert len(table) >= cdiv(num_cached, engine.config.block_size), f"seq {sid}: table too short"
        if swapped:
            assert state in ("paused", "waiting") and table == [], f"swapped seq {sid} is {state} with pages {table}"
    assert len(used) == len(set(used)), f"a page is owned twice: {sorted(used)}"
    assert not set(used) & set(snap["free"]), "a page is both free and owned"
    assert sorted(used + snap["free"]) == list(range(engine.num_blocks)), "pages leaked or invented"
    assert engine.num_free_blocks == len(snap["free"])


def single_shot(engine_factory, contexts: list[list[int]], sp: SamplingParams) -> list[list[int]]:
    """``generate`` over the given contexts on a fresh engine (one batch)."""
    return engine_factory().generate(contexts, sp)


def assert_turns_match_single_shot(recs: list[SeqRecord], engine_factory, oracle_model=None, max_model_len=None,
                                   lp_tol: float = 1e-4) -> int:
    """Turn k of every sequence == generate(context before turn k) (and the no-cache oracle). Returns #turns checked."""
    groups: dict[SamplingParams, list[tuple[SeqRecord, int]]] = {}
    for r in recs:
        for k in range(len(r.outputs)):
            groups.setdefault(r.sp, []).append((r, k))
    checked = 0
    for sp, items in groups.items():
        got = single_shot(engine_factory, [r.contexts[k] for r, k in items], sp)
        for (r, k), toks in zip(items, got):
            out = r.outputs[k]
            assert out.token_ids == toks, (
                f"seq {r.sid} turn {k} (context {len(r.contexts[k])} tokens, stop {out.stop_reason}): "
                f"multi-turn {out.token_ids} != single-shot {toks}")
            if oracle_model is not None:
                o = oracle_generate(oracle_model, r.contexts[k], sp, max_model_len)
                assert out.token_ids == o.token_ids, (
                    f"seq {r.sid} turn {k}: multi-turn {out.token_ids} != no-cache oracle {o.token_ids} "
                    f"(oracle min top-1/top-2 margin {min(o.margins):.2e})")
                assert out.stop_reason == o.stop_reason, f"seq {r.sid} turn {k}: {out.stop_reason} vs oracle {o.stop_reason}"
                if out.logprobs is not None:
                    d = max(abs(a - b) for a, b in zip(out.logprobs, o.logprobs))
                    assert d <= lp_tol, f"seq {r.sid} turn {k}: logprobs differ from the oracle by {d:.2e}"
            checked += 1
    return checked


# ----------------------------------------------------------------------------- attention oracle

def dense_attention_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """float64 attention of one query ``q [n_q, D]`` over ``keys, values [L, n_kv, D]`` (GQA); zeros when L == 0."""
    n_q, D = q.shape
    if keys.shape[0] == 0:
        return torch.zeros(n_q, D, dtype=torch.float64)
    scale = D ** -0.5 if scale is None else scale
    group = n_q // keys.shape[1]
    out = torch.empty(n_q, D, dtype=torch.float64)
    for h in range(n_q):
        k = keys[:, h // group].double()
        v = values[:, h // group].double()
        s = (k @ q[h].double()) * scale
        out[h] = torch.softmax(s, 0) @ v
    return out


def lse_one(q: torch.Tensor, keys: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    n_q, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    if keys.shape[0] == 0:
        return torch.full((n_q,), -math.inf, dtype=torch.float64)
    group = n_q // keys.shape[1]
    return torch.stack([torch.logsumexp((keys[:, h // group].double() @ q[h].double()) * scale, 0) for h in range(n_q)])


def make_paged(rng: torch.Generator, lens: list[int], block_size: int, n_kv: int, D: int, spare_pages: int = 3,
               extra_cols: int = 1, dtype=torch.float32):
    """Random K/V for sequences of ``lens`` scattered over shuffled pages; every unwritten slot and
    every page no table uses holds NaN. Returns (k_cache, v_cache, tables, seq_lens, dense_k, dense_v)."""
    need = [cdiv(n, block_size) for n in lens]
    N = sum(need) + spare_pages
    perm = torch.randperm(N, generator=rng).tolist()
    k_cache = torch.full((N, block_size, n_kv, D), float("nan"), dtype=dtype)
    v_cache = torch.full((N, block_size, n_kv, D), float("nan"), dtype=dtype)
    M = max(need + [0]) + extra_cols
    tables = torch.full((len(lens), M), -1, dtype=torch.long)
    dense_k, dense_v = [], []
    for b, n in enumerate(lens):
        pages = [perm.pop() for _ in range(need[b])]
        tables[b, :need[b]] = torch.tensor(pages, dtype=torch.long)
        k = torch.randn(n, n_kv, D, generator=rng).to(dtype)
        v = torch.randn(n, n_kv, D, generator=rng).to(dtype)
        for p in range(n):
            k_cache[pages[p // block_size], p % block_size] = k[p]
            v_cache[pages[p // block_size], p % block_size] = v[p]
        dense_k.append(k)
        dense_v.append(v)
    return k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.long), dense_k, dense_v


# ----------------------------------------------------------------------------- process grids

def run_grids(worker, grids: list[tuple[int, int]], tmp, *extra) -> dict[tuple[int, int], dict]:
    """Launch every ``(tp, cp)`` grid at once (``torch.multiprocessing``, ``file://`` rendezvous under ``tmp``);
    ``worker(rank, world, init_file, tp, cp, out, *extra)`` saves the driver's results to ``out``."""
    import torch.multiprocessing as mp
    jobs = []
    for tp, cp in grids:
        out = str(tmp / f"tp{tp}_cp{cp}.pt")
        args = (tp * cp, str(tmp / f"rdv_{tp}_{cp}"), tp, cp, out, *extra)
        jobs.append(((tp, cp), out, mp.start_processes(worker, args=args, nprocs=tp * cp, join=False,
                                                        start_method="spawn")))
    try:
        for _, _, pc in jobs:
            while not pc.join():
                pass
    finally:   # a failed grid: stop the processes this call started
        for _, _, pc in jobs:
            for p in pc.processes:
                if p.is_alive():
                    p.terminate()
    return {grid: torch.load(out) for grid, out, _ in jobs}
