"""Tensor x context parallel reference engine on ``torch.distributed`` (gloo on CPUs, NCCL on GPUs).

Ranks form a ``tp x cp`` grid, ``rank = cp_rank * tp + tp_rank``: the TP group of a rank is its
row (same ``cp_rank``), its CP group its column (same ``tp_rank``). Rank 0 drives: it runs the
unchanged host side (``EngineCore``: sequences, block manager, scheduler) and its runner
broadcasts every ``StepBatch`` (numpy arrays + sampling parameters) to the other ranks, which
run ``follow()`` until rank 0 sends the stop message (``shutdown()``). Every rank then runs the
same step on its shard:

* TP (``parallel_model.py``): column/row-parallel linears, vocab-parallel embedding and LM head,
  all-reduce / all-gather over the TP group.
* CP (``parallel_attention.py``): logical block ``j`` of a sequence lives on CP rank ``j % cp``;
  each rank attends over its own blocks, the partial states are all-gathered over the CP
  group and folded in global block order with ``reference.attention.merge_states``.

Usage (``torchrun --nproc-per-node 4 script.py``)::

    dist.init_process_group("gloo")                      # NCCL: torch.cuda.set_device(local_rank) first
    eng = ParallelEngine.from_pretrained("tiny", tp=2, cp=2)
    if eng.is_driver:
        with eng:                                        # leaving the block stops the followers
            sid = eng.rollout_add(prompt, sp); out = eng.rollout_run_turns(); ...
    else:
        eng.follow()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import attention
from .config import EngineConfig, ModelConfig
from .engine import _DTYPES, EngineCore
from .errors import ConfigError, TurnKVError
from .kernels import ReferenceKernels
from .kv_cache import KVCache, blocks_for
from .parallel_attention import cp_attention, owned_slots
from .parallel_model import ShardedQwen3, TPShard
from .runner import ReferenceRunner, StepResult
from .sampling import sample_batch
from .scheduler import PageOps, StepBatch
from .types import SamplingParams, SplitKVPolicy
from .weights import named_or_checkpoint

DRIVER = 0


class FollowerError(TurnKVError, RuntimeError):
    """A rollout call reached a follower rank: only rank 0 drives the engine."""


@dataclass(slots=True)
class ParallelConfig:
    """``tp`` tensor-parallel x ``cp`` context-parallel ranks (``world_size = tp * cp``)."""

    tp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "cp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")

    @property
    def world_size(self) -> int:
        return self.tp * self.cp

    def check(self, cfg: ModelConfig) -> None:
        """``tp`` must divide the query heads, the KV heads and the MLP width (typed ``ConfigError``)."""
        TPShard.of(cfg, self.tp, 0)


@dataclass(slots=True)
class Grid:
    """This process's place in the ``tp x cp`` grid and its two process groups."""

    tp: int
    cp: int
    rank: int
    tp_group: Any
    cp_group: Any
    comm_device: torch.device   # where collectives' tensors live: the CPU (gloo) or this rank's GPU (NCCL)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def cp_rank(self) -> int:
        return self.rank // self.tp

    @staticmethod
    def create(pc: ParallelConfig) -> "Grid":
        """Build the groups; every rank must call this, in the same order (``new_group``'s rule)."""
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("call torch.distributed.init_process_group before building a ParallelEngine")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world != pc.world_size:
            raise ConfigError(f"tp={pc.tp} x cp={pc.cp} needs {pc.world_size} ranks, the process group has {world}")
        tp_groups = [dist.new_group([c * pc.tp + t for t in range(pc.tp)]) for c in range(pc.cp)]
        cp_groups = [dist.new_group([c * pc.tp + t for c in range(pc.cp)]) for t in range(pc.tp)]
        nccl = "nccl" in str(dist.get_backend()).lower()
        dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        return Grid(pc.tp, pc.cp, rank, tp_groups[rank // pc.tp], cp_groups[rank % pc.tp], dev)


@dataclass(slots=True)
class StepMessage:
    """What a follower needs of a ``StepBatch``: its arrays and the sampling rows' parameters."""

    kind: str                    # "prefill" | "decode"
    input_ids: np.ndarray        # [T] int64
    positions: np.ndarray        # [T] int32
    q_seq_idx: np.ndarray        # [T] int32
    slot_mapping: np.ndarray     # [T] int32
    block_tables: np.ndarray     # [B, M] int32
    seq_lens: np.ndarray         # [B] int32
    sample_rows: np.ndarray      # [S] int64
    params: list[SamplingParams]

    @staticmethod
    def of(batch: StepBatch) -> "StepMessage":
        return StepMessage(batch.kind, batch.input_ids, batch.positions, batch.q_seq_idx, batch.slot_mapping,
                           batch.block_tables, batch.seq_lens, batch.sample_rows, [s.params for s in batch.sample_seqs])

    @staticmethod
    def scoring(ids: list[int], block_size: int) -> "StepMessage":
        """A one-sequence prefill over a scratch table ``[0, 1, .., n-1]`` with every row's logits."""
        T = len(ids)
        pos = np.arange(T, dtype=np.int32)
        return StepMessage("prefill", np.asarray(ids, dtype=np.int64), pos, np.zeros(T, dtype=np.int32),
                           pos.copy(), np.arange(blocks_for(T, block_size), dtype=np.int32)[None, :],
                           np.asarray([T], dtype=np.int32), np.arange(T, dtype=np.int64), [])


class ParallelRunner(ReferenceRunner):
    """``execute(batch) -> StepResult`` like ``ReferenceRunner``, on one rank's shard of the grid.

    On the driver, every call that touches device state (``apply_ops``, ``execute``, ``score``,
    ``load_weights``) first broadcasts itself; ``follow()`` replays them on the other ranks in
    the same order. Page operations (swap, copy-on-write) act on each rank's local pages; under
    CP a page's copy on a rank that does not own its block holds nothing anyone reads."""

    def __init__(self, model: ShardedQwen3, kv: KVCache, grid: Grid, policy: SplitKVPolicy,
                 batch_invariant: bool = False) -> None:
        super().__init__(model, kv, policy, batch_invariant)   # type: ignore[arg-type]
        self.grid = grid

    # ---------------------------------------------------------------- driver <-> followers
    def _send(self, kind: str, payload: Any = None) -> None:
        if self.grid.rank != DRIVER:
            raise FollowerError(f"rank {self.grid.rank} cannot send {kind!r}: only rank {DRIVER} drives")
        dist.broadcast_object_list([(kind, payload)], src=DRIVER, device=self._obj_device())

    def _recv(self) -> tuple[str, Any]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=DRIVER, device=self._obj_device())
        return box[0]

    def _obj_device(self) -> torch.device | None:
        return self.grid.comm_device if self.grid.comm_device.type == "cuda" else None

    def execute(self, batch: StepBatch) -> StepResult:
        """Driver: send the step to every follower, run it here, return the sampled tokens."""
        msg = StepMessage.of(batch)
        self._send("step", msg)
        return self.run(msg)

    def score(self, ids: list[int]) -> torch.Tensor:
        """Driver: teacher-forced float32 logits ``[T, V]`` of one sequence, in a scratch cache on every rank."""
        self._send("score", ids)
        return self._score(ids)

    def apply_ops(self, ops: PageOps) -> None:
        """Driver: swap / copy-on-write page operations, on every rank."""
        self._send("ops", ops)
        self._apply_ops_here(ops)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Driver: new full weights to every rank (each keeps its shard)."""
        self._send("weights", weights)
        self._load_weights_here(weights)

    def _apply_ops_here(self, ops: PageOps) -> None:
        """This rank's part of a page operation (the optimized runner overrides it)."""
        super().apply_ops(ops)

    def _load_weights_here(self, weights: dict[str, torch.Tensor]) -> None:
        """This rank's shard of new weights (the optimized runner overrides it)."""
        self.model = self.model.with_weights(weights)

    def stop(self) -> None:
        self._send("stop")

    def follow(self) -> None:
        """Follower: run every broadcast step until the stop message."""
        while True:
            kind, payload = self._recv()
            if kind == "stop":
                return
            if kind == "step":
                self.run(payload)
            elif kind == "score":
                self._score(payload)
            elif kind == "ops":
                self._apply_ops_here(payload)
            elif kind == "weights":
                self._load_weights_here(payload)
            else:
                raise RuntimeError(f"unknown message {kind!r} from the driver")

    # ---------------------------------------------------------------- one step, every rank
    def _score(self, ids: list[int]) -> torch.Tensor | None:
        cfg, bs = self.model.cfg, self.kv.block_size
        scratch = KVCache(cfg.num_hidden_layers, blocks_for(len(ids), bs), bs, self.model.shard.n_kv, cfg.head_dim,
                          self.model.dtype)
        msg = StepMessage.scoring(ids, bs)
        return self._logits(self._forward(msg, scratch), msg)

    def _forward(self, msg: StepMessage, kv: KVCache) -> torch.Tensor:
        """Hidden states ``[T, H]`` of a step (identical on every rank); writes this rank's K/V into ``kv``."""
        g = self.grid
        ids = torch.from_numpy(msg.input_ids)                             # [T]
        pos = torch.from_numpy(msg.positions).long()                      # [T]
        qidx = torch.from_numpy(msg.q_seq_idx).long()                     # [T]
        slots = torch.from_numpy(msg.slot_mapping).long()                 # [T]
        tables = torch.from_numpy(msg.block_tables).long()                # [B, M]
        lens = torch.from_numpy(msg.seq_lens).long()                      # [B]
        if g.cp > 1:
            slots = owned_slots(slots, pos, kv.block_size, g.cp, g.cp_rank)   # this rank's blocks only
        split = self._split(msg)
        theta = self.model.cfg.rope_theta if self.model.rope_in_attention else None

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kv.write(layer, slots, k, v)
            if g.cp > 1:   # one path for prefill and decode: splits = blocks, merged in global block order
                return cp_attention(q, kv.k[layer], kv.v[layer], tables, qidx, pos, g.cp, g.cp_rank, g.cp_group,
                                    g.comm_device, rope_theta=theta)
            if self.batch_invariant:
                return attention.invariant_attention(q, kv.k[layer], kv.v[layer], tables, qidx, pos, split,
                                                     rope_theta=theta)
            if msg.kind == "prefill":
                return attention.paged_prefill(q, kv.k[layer], kv.v[layer], tables, lens, qidx, pos, rope_theta=theta)
            return attention.split_kv_decode(q, kv.k[layer], kv.v[layer], tables, lens, split, rope_theta=theta)

        return self.model.forward(ids, pos, attend)

    def _split(self, msg: StepMessage) -> int | None:
        """The split size of the step: a block under CP, else the reference policy's."""
        if self.grid.cp > 1:
            return self.kv.block_size
        if msg.kind == "decode" or self.batch_invariant:
            return attention.split_size_for(self.policy.kind, self.policy.split_size, msg.seq_lens.tolist(),
                                            self.model.cfg.num_key_value_heads)
        return None

    def _logits(self, hidden: torch.Tensor, msg: StepMessage) -> torch.Tensor | None:
        """float32 ``[S, V]`` of the sampling rows on the driver. Only the driver's TP group (``cp_rank 0``)
        runs the LM head: the other CP ranks hold the same hidden states and need no logits."""
        if self.grid.cp_rank != 0:
            return None
        logits = self.model.logits(hidden[torch.from_numpy(msg.sample_rows)])      # [S, V]
        return logits if self.grid.rank == DRIVER else None

    def run(self, msg: StepMessage) -> StepResult | None:
        """Every rank: the step's forward; the driver samples (``None`` on followers)."""
        logits = self._logits(self._forward(msg, self.kv), msg)
        if logits is None:
            return None
        positions = [int(msg.positions[r]) + 1 for r in msg.sample_rows]        # where the sampled tokens land
        toks, lps = sample_batch(logits, msg.params, positions)
        return StepResult(toks, lps, self._split(msg) if msg.kind == "decode" else None,
                          logits if self.record_logits else None)


class ParallelEngine(EngineCore):
    """The reference engine over a ``tp x cp`` grid. Build it on every rank; rank 0 drives (same rollout
    API as ``reference.Engine``), the others call ``follow()``. Under CP the split-KV policy in force is
    ``fixed:<block_size>`` (one split per block), and ``TurnOutput`` reports it."""

    name = "reference-parallel"

    def __init__(self, model_cfg: ModelConfig, weights: dict[str, torch.Tensor], engine_cfg: EngineConfig | None = None,
                 parallel: ParallelConfig | None = None) -> None:
        engine_cfg = engine_cfg or EngineConfig()
        self.parallel = parallel or ParallelConfig()
        TPShard.of(model_cfg, self.parallel.tp, 0)                        # typed errors before any collective
        if engine_cfg.batch_invariant and self.parallel.world_size > 1:
            raise ConfigError("batch_invariant=True is single-rank only: the TP all-reduce and the CP block "
                              "attention do not promise batch-shape-independent bits")
        self.grid = Grid.create(self.parallel)
        super().__init__(model_cfg, engine_cfg)
        if self.parallel.cp > 1:
            self.policy = SplitKVPolicy("fixed", engine_cfg.block_size)
        self.dtype = _DTYPES[engine_cfg.dtype]
        shard = TPShard.of(model_cfg, self.parallel.tp, self.grid.tp_rank)
        self.model = ShardedQwen3(model_cfg, weights, shard, self.grid.tp_group, self.dtype,
                                  engine_cfg.batch_invariant, engine_cfg.rope_in_attention, self.grid.comm_device)
        self.kv = KVCache(model_cfg.num_hidden_layers, self.num_blocks, engine_cfg.block_size, shard.n_kv,
                          model_cfg.head_dim, self.dtype)
        self.runner = ParallelRunner(self.model, self.kv, self.grid, self.policy, engine_cfg.batch_invariant)
        self.kernels = ReferenceKernels(self.dtype)   # single-rank kernel entry points (no collectives)
        self._stopped = False

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, tp: int = 1, cp: int = 1, seed: int = 0,
                        **engine_kwargs: Any) -> "ParallelEngine":
        """Like ``Engine.from_pretrained``; every rank reads (or draws) the full weights and keeps its shard."""
        cfg, weights = named_or_checkpoint(name_or_path, seed)
        return cls(cfg, weights, EngineConfig(**engine_kwargs), ParallelConfig(tp, cp))

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, weights: dict[str, torch.Tensor], *, tp: int = 1, cp: int = 1,
                        **engine_kwargs: Any) -> "ParallelEngine":
        return cls(cfg, weights, EngineConfig(**engine_kwargs), ParallelConfig(tp, cp))

    @property
    def is_driver(self) -> bool:
        return self.grid.rank == DRIVER

    def _drive(self) -> None:
        if not self.is_driver:
            raise FollowerError(f"rank {self.grid.rank} follows rank {DRIVER}: call follow() here, drive from rank 0")
        if self._stopped:
            raise FollowerError("the engine was shut down: its followers have left")

    def _add(self, prompt_ids: Any, sp: SamplingParams | None, agentic: bool) -> int:
        self._drive()
        return super()._add(prompt_ids, sp, agentic)

    @torch.no_grad()
    def _execute(self, batch: StepBatch) -> StepResult:
        self._drive()
        return self.runner.execute(batch)

    @torch.no_grad()
    def _score(self, ids: list[int]) -> torch.Tensor:
        self._drive()
        return self.runner.score(ids)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self._drive()
        self.runner.load_weights(weights)
        self.model = self.runner.model

    @torch.no_grad()
    def follow(self) -> None:
        """Followers: execute the driver's steps until it calls ``shutdown()``."""
        if self.is_driver:
            raise FollowerError("rank 0 drives; follow() is for the other ranks")
        self.runner.follow()

    def shutdown(self) -> None:
        """Driver: release the followers (their ``follow()`` returns). Idempotent."""
        if self.is_driver and not self._stopped:
            self._stopped = True
            self.runner.stop()

    def __enter__(self) -> "ParallelEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
