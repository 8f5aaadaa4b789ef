"""Tensor and context parallelism of the optimized engine (``optimized/parallel.py``) on gloo + CPU processes.

Three grids (``torch.multiprocessing``, ``file://`` rendezvous in a temporary directory) run
``optimized.parallel.ParallelEngine`` with tp=2, cp=2 and tp=2 x cp=2 on the torch stand-ins of the CUDA kernels (the
approach of ``test_optimized_host.py``; the stand-in ``embedding`` gives zero rows for
out-of-range ids, like the kernel). Rank 0 drives a greedy multi-turn rollout, a ``score`` and a
weight update; the other ranks follow. The driver's tokens are compared with the single-rank optimized
engine (same stand-ins) and the reference bf16 engine, run in this process: the TP all-reduce
reassociates bf16 sums and CP folds one split per block, so the rule is agreement on >= 90% of turns, not bit equality.
NCCL on GPUs is not exercised here (no GPU in CI)."""

from __future__ import annotations

import datetime
import types

import pytest
import torch
import torch.distributed as dist

import reference
from reference import attention
from reference.parallel import FollowerError
from reference.weights import random_weights

from _helpers import TINY, run_grids, tiny_weights
from _standins import _standin_ops, run_on_cpu
from test_optimized_host import PROMPTS, _agree, _reference, _rollout

KW = {"block_size": 4, "max_model_len": 128, "num_blocks": 256, "split_kv": "fixed:8"}
GREEDY = [reference.SamplingParams(max_tokens=6, stop_token_ids=())] * len(PROMPTS)
TIMEOUT = datetime.timedelta(seconds=120)


def _standins() -> types.SimpleNamespace:
    """The host test's stand-ins, with the kernel's rule for ids outside the table: zero rows."""
    ops = _standin_ops()

    def embedding(ids, table):
        i = ids.long()
        inside = (i >= 0) & (i < table.shape[0])
        rows = table[torch.where(inside, i, 0)]
        return torch.where(inside[:, None], rows, torch.zeros((), dtype=table.dtype))

    def split_kv_partials(q, kc, vc, bt, lens, split, scale=None, max_splits=None):
        return attention.split_kv_partials(q, kc, vc, bt.long(), lens.long(), split, scale, max_splits)

    def split_kv_reduce(o, lse):
        return attention.reduce_splits(o, lse)[0].to(torch.bfloat16)

    ops.embedding, ops.split_kv_partials, ops.split_kv_reduce = embedding, split_kv_partials, split_kv_reduce
    return ops


def _install(patch) -> None:
    run_on_cpu(patch, _standins())


def _scenario(eng) -> dict:
    got = _rollout(eng, PROMPTS, GREEDY)
    ctx = PROMPTS[2] + got[0][2]
    scored = eng.score(ctx)
    eng.update_weights(random_weights(TINY, 1))
    sid = eng.rollout_add(PROMPTS[3], GREEDY[0])
    after = eng.rollout_run_turns()[sid].token_ids
    eng.rollout_finish(sid)
    return {"turns": got, "score": scored, "after": after}


def _worker(rank: int, world: int, init_file: str, tp: int, cp: int, out: str) -> None:
    torch.set_num_threads(1)
    _install(setattr)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        from optimized.parallel import ParallelEngine
        eng = ParallelEngine.from_state_dict(TINY, tiny_weights(0), tp=tp, cp=cp, use_graphs=True, **KW)
        cuda = eng.runner.cuda
        assert not cuda.use_graphs, "a grid of more than one rank runs eagerly"
        D, Vp = TINY.head_dim, -(-TINY.vocab_size // tp)
        assert cuda.layers[0]["wqkv"].shape[0] == (TINY.num_attention_heads + 2 * TINY.num_key_value_heads) * D // tp
        assert cuda.layers[0]["wd"].shape[1] == TINY.intermediate_size // tp
        assert cuda.embed.shape[0] == Vp and cuda.lm_head.shape[0] == Vp
        assert cuda.k_cache[0].shape[2] == TINY.num_key_value_heads // tp
        if eng.is_driver:
            with eng:
                result = _scenario(eng)
                result["split_kv"] = str(eng.policy)
            torch.save(result, out)
        else:
            with pytest.raises(FollowerError):
                eng.rollout_add([1, 2, 3])
            eng.follow()
    finally:
        dist.destroy_process_group()


GRIDS = [(2, 1), (1, 2), (2, 2)]   # (tp, cp)


@pytest.fixture(scope="module")
def grids(tmp_path_factory) -> dict:
    """Every grid launched at once (8 processes sharing the cores); the driver's results of each."""
    tmp = tmp_path_factory.mktemp("opt_parallel")
    return run_grids(_worker, GRIDS, tmp)


@pytest.fixture
def single(monkeypatch):
    _install(monkeypatch.setattr)
    import optimized.engine as oe
    return oe.Engine.from_state_dict(TINY, tiny_weights(0), device="cpu", use_graphs=False, **KW)


@pytest.fixture(scope="module")
def baselines() -> dict:
    """The single-rank optimized engine (stand-in kernels) and the reference bf16 engine, in this process."""
    mp_ = pytest.MonkeyPatch()
    try:
        _install(mp_.setattr)
        import optimized.engine as oe
        one = _scenario(oe.Engine.from_state_dict(TINY, tiny_weights(0), device="cpu", use_graphs=False, **KW))
    finally:
        mp_.undo()
    return {"optimized": one, "reference": _scenario(_reference())}


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"tp{g[0]}_cp{g[1]}")
def test_grid_matches_single_rank_and_reference(grids, baselines, grid):
    got, one, ref = grids[grid], baselines["optimized"], baselines["reference"]
    vs_one, vs_ref = _agree(got["turns"], one["turns"]), _agree(got["turns"], ref["turns"])
    print(f"optimized tp={grid[0]} cp={grid[1]} vs single-rank optimized: {vs_one:.0%}, "
          f"vs reference bf16: {vs_ref:.0%} of turns identical")
    assert vs_one >= 0.9 and vs_ref >= 0.9
    assert got["split_kv"] == ("fixed:4" if grid[1] > 1 else "fixed:8")
    assert got["score"].shape == one["score"].shape == (len(PROMPTS[2]) + len(got["turns"][0][2]), TINY.vocab_size)
    if got["turns"][0][2] == one["turns"][0][2]:   # the same trajectory: logits agree to bf16 noise
        assert (got["score"] - one["score"]).abs().max() < 0.1 * one["score"].abs().max()
    assert got["after"][:2] == one["after"][:2], "the weight update did not reach every shard"
