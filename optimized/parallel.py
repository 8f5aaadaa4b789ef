"""Tensor x context parallelism for the optimized engine on ``torch.distributed`` (NCCL on GPUs, gloo for CPU tests).

The driver/follower machinery is the reference's (``reference/parallel.py``): ranks form the
same ``tp x cp`` grid (``rank = cp_rank * tp + tp_rank``), rank 0 runs the host side
(``EngineCore``) and broadcasts every step with ``ParallelRunner._send``; the other ranks call
``follow()`` until ``shutdown()``. What runs on each rank is ``ShardedCudaRunner``: ``CudaRunner``
(our kernels through ``optimized.ops``) on one TP shard of the weights, sliced by
``reference.parallel_model.shard_weights``, through three hooks of ``CudaRunner.forward``
(``_embed``, ``_reduce``, ``_attend``) and its ``logits``:

* TP: q/k/v and gate/up rows per head / intermediate shard, o_proj and down_proj columns; their
  partial products are summed with ``dist.all_reduce`` over the TP group (in float32, rounded
  once to bf16, like the reference). Vocab-parallel embedding: the ``embedding`` kernel on ids
  shifted by the shard's start (out-of-range ids give zero rows), then the same all-reduce
  (exact: one non-zero term). Vocab-parallel LM head: fp32 logits of the padded shard,
  all-gathered and cut to ``V`` before sampling, so every rank samples the same tokens (only
  the driver's are used).
* CP: logical block ``j`` of a sequence lives on CP rank ``j % cp``; a rank writes only the K/V of
  its blocks and computes the partial states of its blocks only, with ``split_kv_partials`` over a
  compact table of its pages (``split_size = block_size``; a query's visible owned keys are a
  prefix of that table). Prefill rows run as one-query "sequences" over keys ``0 .. pos``. The
  states are all-gathered over the CP group, interleaved back into global block order and
  folded with ``split_kv_reduce`` (block ``0, 1, 2, ...``). The split-KV policy in force is
  ``fixed:<block_size>``, as in the reference.

Decode steps run eagerly when the grid has more than one rank (no CUDA graphs around the collectives).

Usage (``torchrun --nproc-per-node 2 script.py``)::

    torch.cuda.set_device(local_rank); dist.init_process_group("nccl")
    eng = ParallelEngine.from_pretrained("tiny", tp=2, cp=2)
    if eng.is_driver:
        with eng:
            sid = eng.rollout_add(prompt, sp); out = eng.rollout_run_turns(); ...
    else:
        eng.follow()
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from reference.config import EngineConfig, ModelConfig, named_config
from reference.engine import EngineCore
from reference.errors import ConfigError
from reference.parallel import DRIVER, Grid, ParallelConfig, ParallelRunner, StepMessage
from reference.parallel import ParallelEngine as _ReferenceParallelEngine
from reference.parallel_attention import _all_gather
from reference.parallel_model import TPShard, shard_weights, tp_all_gather_vocab, tp_all_reduce
from reference.runner import StepResult
from reference.scheduler import PageOps
from reference.types import SamplingParams, SplitKVPolicy
from reference.weights import check_weights, expected_shapes, load_checkpoint, random_tensor

from . import engine as _engine
from . import runner as _runner
from .runner import CudaRunner


def shard_config(cfg: ModelConfig, s: TPShard) -> ModelConfig:
    """The per-rank shapes ``CudaRunner`` sees: this rank's heads and MLP width; an untied, padded LM head."""
    return dataclasses.replace(cfg, num_attention_heads=s.n_q, num_key_value_heads=s.n_kv, intermediate_size=s.inter,
                               tie_word_embeddings=False)


class ShardedCudaRunner(CudaRunner):
    """``CudaRunner`` on one rank of the ``tp x cp`` grid: TP shard ``shard`` of the weights, collectives over
    ``grid.tp_group`` (TP) and ``grid.cp_group`` (CP) through ``grid.comm_device``."""

    def __init__(self, cfg: ModelConfig, ecfg: EngineConfig, weights: dict[str, torch.Tensor], device: torch.device,
                 num_blocks: int, max_model_len: int, policy: SplitKVPolicy, shard: TPShard, grid: Grid,
                 use_graphs: bool = True) -> None:
        self.full_cfg, self.shard, self.grid = cfg, shard, grid
        self.group, self.comm_device = grid.tp_group, grid.comm_device
        super().__init__(shard_config(cfg, shard), ecfg, shard_weights(cfg, weights, shard), device, num_blocks,
                         max_model_len, policy, use_graphs=use_graphs and grid.tp * grid.cp == 1)
        if shard.tp > 1:              # _runner.CANONICAL_GEMM_ROWS was measured on whole weights only
            self.canonical_gemm_min_m, self.canonical_gemm_max_m = 1, 0

    def _prefill_graphed(self, batch) -> bool:
        """No prefill graphs across ranks (their collectives and CP's attention are not captured): one GPU only."""
        return self.grid.tp * self.grid.cp == 1 and super()._prefill_graphed(batch)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        super().load_weights(shard_weights(self.full_cfg, weights, self.shard))

    def decode_split(self, max_len: int, batch: int) -> tuple[int | None, int]:
        """The split size the single-GPU engine would pick (``auto`` reads the full model's KV heads)."""
        cfg = self.cfg
        self.cfg = self.full_cfg
        try:
            return super().decode_split(max_len, batch)
        finally:
            self.cfg = cfg

    # ---------------------------------------------------------------- collectives (the CudaRunner hooks)
    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the TP group, accumulated in float32, rounded once to ``x``'s dtype."""
        return tp_all_reduce(x, self.shard.tp, self.group, self.comm_device)

    def _embed_norm(self, ids: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One launch only with the whole vocabulary on this rank; else the sharded embedding's sum, then the norm."""
        if self.shard.tp == 1:
            return super()._embed_norm(ids, w, eps)
        residual = self._embed(ids)
        return residual, _runner.ops.rmsnorm(residual, w, eps)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: rows of this shard, zeros elsewhere (the kernel's out-of-range rule), summed."""
        if self.shard.tp == 1:
            return _runner.ops.embedding(ids, self.embed)
        if self.embed.shape[0] == 0:                  # a shard past the vocabulary (tp > V): contributes zeros
            rows = torch.zeros(ids.shape[0], self.cfg.hidden_size, dtype=self.embed.dtype, device=self.dev)
        else:
            rows = _runner.ops.embedding((ids - self.shard.vocab_start).to(ids.dtype), self.embed)
        return self._reduce(rows)

    def _kv_slots(self, pos: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """CP: a token's K/V goes to the rank that owns its block (block ``j`` lives on rank ``j % cp``)."""
        g = self.grid
        if g.cp == 1:
            return slots
        owned = ((pos // self.block_size) % g.cp == g.cp_rank) & (slots >= 0)
        return torch.where(owned, slots, torch.full_like(slots, -1))                  # [T]

    def _fuse_qk(self, rows: int) -> bool:
        """CP attends over owned blocks through its own path (``_attend``), after the separate qk_norm_rope."""
        return self.grid.cp == 1 and super()._fuse_qk(rows)

    def _early_attention(self, qidx: torch.Tensor | None) -> bool:
        """CP's attention (``_attend``) is not ``split_kv_decode``'s early launch, so qk_norm_rope waits first."""
        return self.grid.cp == 1 and super()._early_attention(qidx)

    def _attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor,
                tables: torch.Tensor, lens: torch.Tensor, qidx: torch.Tensor | None, pos: torch.Tensor,
                decode_split: int | None, max_splits: int) -> torch.Tensor:
        """CP (the K/V of owned blocks only was written, see ``_kv_slots``): attend over owned blocks, merge all
        ranks' block states in global block order (``reference/parallel_attention.py``'s rule, with our split-KV kernels)."""
        g = self.grid
        if g.cp == 1:
            return super()._attend(i, q, k, v, slots, tables, lens, qidx, pos, decode_split, max_splits)
        bs, cp, r = self.block_size, g.cp, g.cp_rank
        # this rank's blocks r, r + cp, ... as a compact table; the keys a query sees there are a prefix of it
        M = tables.shape[1]
        J = -(-M // cp)
        mine = tables[:, r::cp]                                                        # [B, <= J]
        if mine.shape[1] < J:
            mine = torch.cat([mine, torch.full((mine.shape[0], J - mine.shape[1]), -1, dtype=mine.dtype,
                                               device=mine.device)], 1)
        if qidx is not None:   # prefill: every query row is a "sequence" over keys 0 .. pos
            keys, mine = pos + 1, mine.index_select(0, qidx.long())                    # [T], [T, J]
        else:
            keys = lens                                                                # [B]
        full, rem = keys // bs, keys % bs
        own_keys = torch.clamp((full - r + cp - 1) // cp, min=0) * bs + torch.where(full % cp == r, rem, 0)
        o, lse = _runner.ops.split_kv_partials(q, self.k_cache[i], self.v_cache[i], mine.to(torch.int32).contiguous(),
                                               own_keys.to(torch.int32).contiguous(), bs, self.scale, J)
        o_all = _all_gather(o, g.cp_group, cp, self.comm_device)                     # cp x [B, J, n_q, D] fp32
        lse_all = _all_gather(lse, g.cp_group, cp, self.comm_device)                 # cp x [B, J, n_q]
        B, _, nq, D = o.shape
        o = torch.stack(o_all, 2).reshape(B, J * cp, nq, D).contiguous()             # split i*cp + r = global block
        lse = torch.stack(lse_all, 2).reshape(B, J * cp, nq).contiguous()
        return _runner.ops.split_kv_reduce(o, lse)                                     # global block order fold

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[S, H]`` -> float32 ``[S, V]`` on every TP rank: local ``[S, Vp]`` shards, all-gathered in vocab order."""
        local = super().logits(hidden)                                                # [S, Vp] fp32
        return tp_all_gather_vocab(local, self.shard.tp, self.full_cfg.vocab_size, self.group,
                                   self.comm_device).contiguous()


@dataclasses.dataclass(slots=True)
class _Seq:
    params: SamplingParams


class _MessageBatch:
    """A ``StepMessage`` in the shape ``CudaRunner.execute`` reads of a ``StepBatch``."""

    def __init__(self, m: StepMessage) -> None:
        self.kind, self.input_ids, self.positions, self.q_seq_idx = m.kind, m.input_ids, m.positions, m.q_seq_idx
        self.slot_mapping, self.block_tables, self.seq_lens, self.sample_rows = (m.slot_mapping, m.block_tables,
                                                                                 m.seq_lens, m.sample_rows)
        self.sample_seqs = [_Seq(p) for p in m.params]
        self.seqs = range(len(m.seq_lens))


class ParallelCudaRunner(ParallelRunner):
    """The reference's driver/follower runner (``_send`` / ``_recv`` / ``execute`` / ``stop``) around a
    ``ShardedCudaRunner``: every broadcast message is replayed on each rank's GPU shard."""

    def __init__(self, cuda: ShardedCudaRunner, grid: Grid) -> None:   # no ReferenceRunner state: the pages live in ``cuda``
        self.cuda = cuda
        self.grid = grid
        self.policy = cuda.policy
        self.batch_invariant = False

    @property
    def record_logits(self) -> bool:
        return self.cuda.record_logits

    @record_logits.setter
    def record_logits(self, on: bool) -> None:
        self.cuda.record_logits = on

    # ---------------------------------------------------------------- driver side (broadcast, then run here)
    def score(self, ids: list[int], pages: list[int]) -> torch.Tensor:   # type: ignore[override]
        """Driver: teacher-forced float32 logits ``[T, V]`` in ``pages`` (the same page ids on every rank)."""
        self._send("score", (ids, pages))
        return self._score((ids, pages))

    # the reference's driver/follower loop, with this rank's work done by the CUDA runner
    def _apply_ops_here(self, ops: PageOps) -> None:
        self.cuda.apply_ops(ops)

    def _load_weights_here(self, weights: dict[str, torch.Tensor]) -> None:
        self.cuda.load_weights(weights)

    # ---------------------------------------------------------------- every rank
    def _score(self, payload: tuple[list[int], list[int]]) -> torch.Tensor:   # type: ignore[override]
        ids, pages = payload
        return self.cuda.score(ids, pages)

    def run(self, msg: StepMessage) -> StepResult | None:
        """Every rank runs the whole step (the LM head's all-gather and the sampler too); the driver returns it."""
        result = self.cuda.execute(_MessageBatch(msg))   # type: ignore[arg-type]
        return result if self.grid.rank == DRIVER else None


class ParallelEngine(_ReferenceParallelEngine):
    """The optimized engine over a ``tp x cp`` grid of GPUs: build it on every rank; rank 0 drives (the rollout
    API of ``optimized.Engine``), the others call ``follow()``. Under CP the split-KV policy is ``fixed:<block_size>``."""

    name = "optimized-parallel"

    def __init__(self, model_cfg: ModelConfig, weights: dict[str, torch.Tensor] | None,
                 engine_cfg: EngineConfig | None = None, parallel: ParallelConfig | None = None,
                 device: str | torch.device | None = None, use_graphs: bool = True, seed: int = 0) -> None:
        engine_cfg = engine_cfg or _engine.engine_config()
        self.parallel = parallel or ParallelConfig()
        if engine_cfg.dtype != "bfloat16":
            raise ConfigError("the optimized engine computes in bfloat16; pass dtype='bfloat16'")
        _engine.check_supported(model_cfg, engine_cfg)
        if engine_cfg.batch_invariant or engine_cfg.rope_in_attention:
            raise ConfigError("the TP x CP optimized engine does not support batch_invariant=True or "
                              "rope_in_attention=True yet (the single-GPU optimized engine and the reference do)")
        TPShard.of(model_cfg, self.parallel.tp, 0)                        # typed errors before any collective
        self.grid = Grid.create(self.parallel)
        if device is None:   # NCCL: the GPU torch.cuda.set_device chose for this rank
            device = self.grid.comm_device if self.grid.comm_device.type == "cuda" else "cuda"
        dev = _engine.require_cuda(device)
        EngineCore.__init__(self, model_cfg, engine_cfg)
        if self.parallel.cp > 1:   # one split per block, as in the reference (TurnOutput reports it)
            self.policy = SplitKVPolicy("fixed", engine_cfg.block_size)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        self.device = str(dev)
        self.dtype = torch.bfloat16
        if weights is None:   # seeded random weights: the same draw on every rank
            weights = {n: random_tensor(n, s, seed).to(dtype=torch.bfloat16) for n, s in expected_shapes(model_cfg).items()}
        check_weights(model_cfg, weights)
        shard = TPShard.of(model_cfg, self.parallel.tp, self.grid.tp_rank)
        cuda = ShardedCudaRunner(model_cfg, engine_cfg, weights, dev, self.num_blocks, self.max_model_len, self.policy,
                                 shard, self.grid, use_graphs=use_graphs)
        self.runner = ParallelCudaRunner(cuda, self.grid)   # type: ignore[assignment]
        from .kernels_api import OptimizedKernels
        self.kernels = OptimizedKernels(dev)   # single-rank kernel entry points (no collectives)
        self._stopped = False

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, tp: int = 1, cp: int = 1, seed: int = 0,  # type: ignore[override]
                        device: str | None = None, use_graphs: bool = True, **engine_kwargs: Any) -> "ParallelEngine":
        """A named config with seeded random weights (bf16), or a checkpoint directory; every rank keeps its shard."""
        path = Path(str(name_or_path))
        if path.is_dir():
            cfg, weights = load_checkpoint(path)
        else:
            cfg, weights = named_config(str(name_or_path)), None
        return cls(cfg, weights, _engine.engine_config(**engine_kwargs), ParallelConfig(tp, cp),
                   device=device, use_graphs=use_graphs, seed=seed)

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, weights: dict[str, torch.Tensor], *, tp: int = 1,  # type: ignore[override]
                        cp: int = 1, device: str | None = None, use_graphs: bool = True,
                        **engine_kwargs: Any) -> "ParallelEngine":
        return cls(cfg, weights, _engine.engine_config(**engine_kwargs), ParallelConfig(tp, cp),
                   device=device, use_graphs=use_graphs)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self._drive()
        self.runner.load_weights(weights)

    @torch.no_grad()
    def _score(self, ids: list[int]) -> torch.Tensor:
        self._drive()
        return _engine.score_in_pool(self, ids)


__all__ = ["ParallelCudaRunner", "ParallelEngine", "ShardedCudaRunner", "shard_config"]
