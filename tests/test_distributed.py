"""Tensor and context parallelism (``reference/parallel.py``) on torch.distributed, gloo, CPU processes.

Each grid runs in its own process group launched with ``torch.multiprocessing`` (``file://``
rendezvous in a temporary directory): TP=2 x CP=2 (4 processes), TP=2 and CP=2 (2 processes
each), and 1x1. Rank 0 drives a multi-turn rollout and a pool-pressure scenario (swap,
drop and recompute, preemption, a GRPO group's copy-on-write, a weight update), the other
ranks follow; the driver's results are compared with the single-rank reference engine run in
this process. The ``nccl`` parameter repeats the runs through NCCL (one GPU per rank) for the
grids that fit on the machine's GPUs; without CUDA it is skipped.

* Tokens: greedy tokens of every turn equal the single-rank engine's, exactly.
* LOGIT rule (DESIGN §4, the flash-attention form), fp32: for the teacher-forced logits
  (``score``) and the logits of every sampled token (``record_logits``), against a float64
  oracle (the model math of ``reference/model.py`` recomputed densely in float64, with the
  spec's float32 RoPE tables):

      err   = |logits_parallel    - logits_fp64_oracle|
      noise = |logits_single_rank - logits_fp64_oracle|    (the fp32 rounding noise of one rank)
      err  <= 2 * noise + eps32 * |logits_fp64_oracle|     (eps32 = 2**-23: one fp32 rounding step)

  for the maximum over all positions and vocabulary entries and for the mean. The oracle is
  float64 because the float32 dense oracle (``reference.oracle.dense_logits``) runs the same
  float32 operations as the single-rank engine's prefill and matches it bit for bit: measured
  against it the noise is 0 and the rule would collapse to one rounding step, which the
  reassociated TP sums and the per-block CP merge cannot meet (they move logits by ~1e-6).
  The fp32 dense oracle is still checked: single rank == dense_logits, bit for bit.
"""

from __future__ import annotations

import datetime
import os
import random
import sys

import pytest
import torch
import torch.distributed as dist

from reference import Engine, SamplingParams, named_config
from reference.attention import paged_prefill, split_kv_decode
from reference.errors import ConfigError, MergeError
from reference.kv_cache import KVCache
from reference.model import Qwen3Model
from reference.rope import rope_cos_sin
from reference.oracle import dense_logits
from reference.parallel import FollowerError, Grid, ParallelConfig, ParallelEngine
from reference.parallel_attention import block_owner, merge_gathered, owned_block_partials, owned_slots
from reference.parallel_model import TPShard
from reference.weights import random_weights

from _helpers import run_grids

TINY = named_config("tiny")                      # n_q=4, n_kv=2, I=128, V=512: tp=2 divides all
ENGINE_KW = dict(num_blocks=96, max_model_len=192, block_size=4, max_num_batched_tokens=24)  # chunked prefills too
PROMPTS = [3, 8, 13, 30]                         # prompt lengths: inside a block, on a boundary, several blocks
OBSERVATIONS = [[0, 4, 9], [1, 7, 12], [4, 0, 5], [11, 3, 8]]   # per sequence, per resume (empty .. 3 blocks)
PRESSURE_KW = dict(num_blocks=20, max_model_len=72, block_size=4, max_num_batched_tokens=16, swap_space=12)
GRIDS = [(2, 2), (2, 1), (1, 2), (1, 1)]         # (tp, cp)
EPS32 = 2.0 ** -23
TIMEOUT = datetime.timedelta(seconds=300)


# ----------------------------------------------------------------------------- the scenario

def scenario(eng) -> dict:
    """4 sequences, 4 turns each (3 resumes with observations of 0..12 tokens), then ``score`` of each trajectory."""
    rng = random.Random(1)
    sp = SamplingParams(max_tokens=5, stop_token_ids=())
    eng.record_logits(True)
    sids = [eng.rollout_add([rng.randrange(TINY.vocab_size) for _ in range(n)], sp) for n in PROMPTS]
    turns: dict[int, list[list[int]]] = {s: [] for s in sids}
    for k in range(len(OBSERVATIONS[0]) + 1):
        out = eng.rollout_run_turns()
        assert sorted(out) == sids
        for s in sids:
            turns[s].append(out[s].token_ids)
        if k < len(OBSERVATIONS[0]):
            for b, s in enumerate(sids):
                eng.rollout_continue(s, [rng.randrange(TINY.vocab_size) for _ in range(OBSERVATIONS[b][k])])
    trajs = [eng.rollout_finish(s) for s in sids]
    return {
        "turns": [turns[s] for s in sids],
        "tokens": [t.token_ids for t in trajs],
        "mask": [t.assistant_mask for t in trajs],
        "logits": [torch.stack(eng.logit_log[s]) for s in sids],       # [sampled tokens, V]
        "scores": [eng.score(t.token_ids) for t in trajs],             # [T, V]
    }


def pressure_scenario(eng) -> dict:
    """A pool too small for everyone (paused KV swapped to host memory or dropped and recomputed, a running
    sequence preempted), a GRPO group sharing its prompt pages (copy-on-write of the last shared page), and
    a weight update between turns: every page operation and the new weights reach every rank."""
    rng = random.Random(2)
    ids = lambda n: [rng.randrange(TINY.vocab_size) for _ in range(n)]             # noqa: E731
    group = eng.rollout_add_group(ids(12), [SamplingParams(max_tokens=m, stop_token_ids=()) for m in (3, 5, 7)])
    sids = group + [eng.rollout_add(ids(n), SamplingParams(max_tokens=4, stop_token_ids=())) for n in (9, 21)]
    turns: dict[int, list] = {s: [] for s in sids}
    for k in range(4):
        for s, o in eng.rollout_run_turns().items():
            turns[s].append((o.token_ids, o.stop_reason))
        if k == 1:
            eng.update_weights(random_weights(TINY, 1))
        for s in sids:
            if eng.state(s) == "paused":
                eng.rollout_continue(s, ids(rng.choice([0, 3, 4, 9])))
    sc = eng.scheduler
    return {"turns": turns, "tokens": [eng.rollout_finish(s).token_ids for s in sids],
            "counts": (sc.evictions, sc.swaps, sc.preemptions)}


def _worker(rank: int, world: int, init_file: str, tp: int, cp: int, out: str, backend: str) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":      # one GPU per rank; the model still computes on the CPU, collectives go through NCCL
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        result = {}
        for name, run, kw in (("rollout", scenario, ENGINE_KW), ("pressure", pressure_scenario, PRESSURE_KW)):
            eng = ParallelEngine.from_state_dict(TINY, random_weights(TINY, 0), tp=tp, cp=cp, **kw)
            if eng.is_driver:
                with eng:
                    result[name] = run(eng)
                    result[name]["split_kv"] = str(eng.policy)
            else:
                with pytest.raises(FollowerError):
                    eng.rollout_add([1, 2, 3])
                eng.follow()
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- multi-process runs

def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() and dist.is_nccl_available() else 0


BACKENDS = ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(_gpus() < 1, reason="NCCL needs CUDA GPUs"))]


@pytest.fixture(scope="module", params=BACKENDS)
def runs(request, tmp_path_factory) -> dict[tuple[int, int], dict]:
    """Every grid of ``GRIDS`` launched at once (9 processes; they share the machine's cores). Under NCCL,
    the grids that fit on the machine's GPUs (one GPU per rank; concurrent grids share GPUs)."""
    backend = request.param
    tmp = tmp_path_factory.mktemp(f"dist_{backend}")
    fit = [(tp, cp) for tp, cp in GRIDS if backend != "nccl" or tp * cp <= _gpus()]
    return run_grids(_worker, fit, tmp, backend)


def _run_of(runs: dict, grid: tuple[int, int]) -> dict:
    if grid not in runs:
        pytest.skip(f"tp={grid[0]} x cp={grid[1]} needs {grid[0] * grid[1]} GPUs, the machine has {_gpus()}")
    return runs[grid]


@pytest.fixture(scope="module")
def single_runs() -> dict:
    """The single-rank reference engine, on one thread like each worker (a BLAS may block differently per thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: run(Engine.from_state_dict(TINY, random_weights(TINY, 0), **kw))
                for name, run, kw in (("rollout", scenario, ENGINE_KW), ("pressure", pressure_scenario, PRESSURE_KW))}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def single(single_runs) -> dict:
    return single_runs["rollout"]


def dense_logits_fp64(cfg, weights: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """The math of ``reference/model.py``, dense and causal, entirely in float64 (norms, softmax too);
    only the RoPE cos/sin tables are the spec's float32 ones. ``[T, V]`` float64."""
    W = {k: v.double() for k, v in weights.items()}
    T, nq, nkv, D, eps = len(ids), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    cos, sin = (t.double()[:, None, :] for t in rope_cos_sin(torch.arange(T), D, cfg.rope_theta))  # [T, 1, D]
    norm = lambda x, g: g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)            # noqa: E731
    rope = lambda x: x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin       # noqa: E731
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]                                     # [T, H]
    for i in range(cfg.num_hidden_layers):
        w = lambda n, i=i: W[f"model.layers.{i}.{n}.weight"]                                  # noqa: E731
        n = norm(x, w("input_layernorm"))
        q = rope(norm((n @ w("self_attn.q_proj").T).view(T, nq, D), w("self_attn.q_norm")))   # [T, n_q, D]
        k = rope(norm((n @ w("self_attn.k_proj").T).view(T, nkv, D), w("self_attn.k_norm")))  # [T, n_kv, D]
        v = (n @ w("self_attn.v_proj").T).view(T, nkv, D)
        k, v = k.repeat_interleave(nq // nkv, 1), v.repeat_interleave(nq // nkv, 1)           # [T, n_q, D]
        s = torch.einsum("thd,lhd->htl", q, k).masked_fill(~causal, float("-inf")) * D ** -0.5
        x = x + torch.einsum("htl,lhd->thd", torch.softmax(s, -1), v).reshape(T, nq * D) @ w("self_attn.o_proj").T
        m = norm(x, w("post_attention_layernorm"))
        x = x + (torch.nn.functional.silu(m @ w("mlp.gate_proj").T) * (m @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
    return norm(x, W["model.norm.weight"]) @ W["lm_head.weight"].T


@pytest.fixture(scope="module")
def oracle(single) -> list[torch.Tensor]:
    """float64 dense logits of every trajectory (the yardstick of the LOGIT rule)."""
    w = random_weights(TINY, 0)
    return [dense_logits_fp64(TINY, w, ids) for ids in single["tokens"]]


def test_single_rank_equals_fp32_dense_oracle(single):
    """Why the LOGIT rule measures noise against float64: one rank's prefill IS the fp32 dense oracle."""
    model = Qwen3Model(TINY, random_weights(TINY, 0))
    for ids, got in zip(single["tokens"], single["scores"]):
        assert torch.equal(got, dense_logits(model, ids))


def _logit_rule(name: str, par: torch.Tensor, ref: torch.Tensor, gold: torch.Tensor) -> None:
    err = (par.double() - gold).abs()
    noise = (ref.double() - gold).abs()
    mag = gold.abs()
    bound_max, bound_mean = 2 * noise.max() + EPS32 * mag.max(), 2 * noise.mean() + EPS32 * mag.mean()
    cos = torch.nn.functional.cosine_similarity(par.double().flatten(), gold.flatten(), dim=0).item()
    print(f"{name}: max err {err.max():.3g} <= {bound_max:.3g} (noise {noise.max():.3g}), "
          f"mean err {err.mean():.3g} <= {bound_mean:.3g}, |par - one rank| max {(par - ref).abs().max():.3g}, "
          f"cosine {cos:.12f}")
    assert torch.isfinite(par).all(), f"{name}: non-finite logits"
    assert err.max() <= bound_max, f"LOGIT (max) violated by {name}"
    assert err.mean() <= bound_mean, f"LOGIT (mean) violated by {name}"


@pytest.mark.parametrize("grid", GRIDS, ids=[f"tp{t}xcp{c}" for t, c in GRIDS])
def test_greedy_tokens_equal_single_rank(runs, single, grid):
    got = _run_of(runs, grid)["rollout"]
    assert got["turns"] == single["turns"], f"tp={grid[0]} cp={grid[1]}: greedy tokens differ from one rank"
    assert got["tokens"] == single["tokens"] and got["mask"] == single["mask"]
    expect_policy = f"fixed:{ENGINE_KW['block_size']}" if grid[1] > 1 else "fixed:64"
    assert got["split_kv"] == expect_policy


@pytest.mark.parametrize("grid", GRIDS, ids=[f"tp{t}xcp{c}" for t, c in GRIDS])
def test_logits_within_logit_rule(runs, single, oracle, grid):
    got = _run_of(runs, grid)["rollout"]
    for b, dense in enumerate(oracle):
        sampled = [t - 1 for t, m in enumerate(single["mask"][b]) if m]      # row t-1 predicts token t
        _logit_rule(f"tp{grid[0]}xcp{grid[1]} seq {b} score", got["scores"][b], single["scores"][b], dense)
        _logit_rule(f"tp{grid[0]}xcp{grid[1]} seq {b} sampled", got["logits"][b], single["logits"][b], dense[sampled])
    if grid == (1, 1):   # one rank through the parallel code path is the reference engine, bit for bit
        assert all(torch.equal(a, b) for a, b in zip(got["scores"] + got["logits"], single["scores"] + single["logits"]))


@pytest.mark.parametrize("grid", GRIDS, ids=[f"tp{t}xcp{c}" for t, c in GRIDS])
def test_pressure_swap_cow_weight_update_equal_single_rank(runs, single_runs, grid):
    got, want = _run_of(runs, grid)["pressure"], single_runs["pressure"]
    evictions, swaps, preemptions = want["counts"]
    assert evictions and swaps and preemptions, want["counts"]   # the scenario really exercises each path
    assert got["counts"] == want["counts"]
    assert got["turns"] == want["turns"] and got["tokens"] == want["tokens"]


# ----------------------------------------------------------------------------- in-process pieces

def _filled_cache(T: int, bs: int, n_kv: int, D: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A NaN-initialised page pool holding one sequence of ``T`` keys on shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    n = -(-T // bs)
    cache = KVCache(1, n + 3, bs, n_kv, D)
    table = torch.randperm(n + 3, generator=g)[:n][None, :]                 # [1, n]
    pos = torch.arange(T)
    slots = table[0, pos // bs] * bs + pos % bs
    cache.write(0, slots, torch.randn(T, n_kv, D, generator=g), torch.randn(T, n_kv, D, generator=g))
    return cache.k[0], cache.v[0], table


@pytest.mark.parametrize("rope", [None, 1e6], ids=["rope-cached", "rope-in-attention"])
@pytest.mark.parametrize("cp", [1, 2, 3, 5])
def test_cp_merge_equals_paged_attention_in_process(cp, rope):
    """Simulated CP ranks (each with only its owned pages written) merge to the unsplit attention, NaN-free,
    for prefill queries at every position (blocks fully after a query are empty states) and for decode."""
    T, bs, n_q, n_kv, D = 19, 4, 4, 2, 8
    k, v, table = _filled_cache(T, bs, n_kv, D, seed=cp)
    q = torch.randn(T, n_q, D, generator=torch.Generator().manual_seed(7))
    pos, qidx = torch.arange(T), torch.zeros(T, dtype=torch.long)
    parts = []
    for r in range(cp):   # rank r sees NaN everywhere but in its own blocks
        keep = torch.zeros(k.shape[0], dtype=torch.bool)
        keep[table[0, [j for j in range(table.shape[1]) if block_owner(j, cp) == r]]] = True
        kr = torch.where(keep[:, None, None, None], k, float("nan"))
        vr = torch.where(keep[:, None, None, None], v, float("nan"))
        parts.append(owned_block_partials(q, kr, vr, table, qidx, pos, cp, r, rope_theta=rope))
    out = merge_gathered(*map(list, zip(*parts)))
    assert torch.isfinite(out).all()
    expect = paged_prefill(q, k, v, table, torch.tensor([T]), qidx, pos, rope_theta=rope)
    torch.testing.assert_close(out, expect, rtol=0, atol=1e-5)
    dec = split_kv_decode(q[-1:], k, v, table, torch.tensor([T]), bs, rope_theta=rope)
    torch.testing.assert_close(out[-1:], dec, rtol=0, atol=1e-6)


def test_cp_pieces():
    pos = torch.arange(10)
    slots = torch.arange(100, 110)
    assert owned_slots(slots, pos, 4, 2, 0).tolist() == [100, 101, 102, 103, -1, -1, -1, -1, 108, 109]
    assert owned_slots(slots, pos, 4, 2, 1).tolist() == [-1] * 4 + [104, 105, 106, 107] + [-1, -1]
    o, lse, idx = owned_block_partials(torch.randn(1, 4, 8), *_filled_cache(3, 4, 2, 8, 0), torch.zeros(1, dtype=torch.long),
                                       torch.tensor([-1]), 2, 1)
    assert idx.tolist() == [-1] and (o == 0).all() and torch.isinf(lse).all()
    with pytest.raises(MergeError):   # the same global block from two ranks
        merge_gathered([o, o], [lse, lse], [torch.tensor([0]), torch.tensor([0])])


def test_config_errors():
    with pytest.raises(ConfigError):
        TPShard.of(TINY, 3, 0)        # 3 does not divide 4 query heads
    with pytest.raises(ConfigError):
        TPShard.of(TINY, 4, 0)        # 4 does not divide 2 KV heads
    with pytest.raises(ConfigError):
        ParallelConfig(tp=0)
    s = TPShard.of(named_config("tiny"), 2, 1)
    assert (s.n_q, s.n_kv, s.inter, s.vocab_start, s.vocab_end) == (2, 1, 64, 256, 512)
    if not dist.is_initialized():
        with pytest.raises(ConfigError):
            Grid.create(ParallelConfig(tp=2))
    with pytest.raises(ConfigError):   # checked before any process group is needed
        ParallelEngine.from_state_dict(TINY, random_weights(TINY, 0), tp=2, batch_invariant=True)
    with pytest.raises(ConfigError):
        ParallelEngine.from_state_dict(TINY, random_weights(TINY, 0), tp=3)


if __name__ == "__main__":   # pragma: no cover
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-s"]))
