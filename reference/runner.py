"""Runs one scheduled step through the model: write K/V into pages, attend, sample.

This is the piece the optimized engine replaces (``optimized/runner.py``); the scheduler,
the block manager and the sequences stay the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import attention
from .kv_cache import KVCache
from .model import Qwen3Model
from .sampling import sample_batch
from .scheduler import PageOps, StepBatch
from .types import SplitKVPolicy


@dataclass(slots=True)
class StepResult:
    tokens: list[int]            # one per batch.sample_seqs
    logprobs: list[float]
    split_size: int | None       # decode steps: the split size used
    logits: torch.Tensor | None = None   # float32 [S, V] on the CPU, when the engine records logits


class ReferenceRunner:
    def __init__(self, model: Qwen3Model, kv: KVCache, policy: SplitKVPolicy, batch_invariant: bool = False) -> None:
        self.model = model
        self.kv = kv
        self.policy = policy
        self.batch_invariant = batch_invariant
        self.record_logits = False
        self.host: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}   # swapped-out KV by seq_id

    def apply_ops(self, ops: PageOps) -> None:
        """Swap out, swap in, drop host copies, copy-on-write: in that order, before the step's forward."""
        for sid, pages in ops.swap_out:
            self.host[sid] = self.kv.read_pages(pages)
        for sid, pages in ops.swap_in:
            k, v = self.host.pop(sid)
            self.kv.write_pages(pages, k, v)
        for sid in ops.swap_discard:
            self.host.pop(sid, None)
        self.kv.copy_pages(ops.page_copies)

    def execute(self, batch: StepBatch) -> StepResult:
        ids = torch.from_numpy(batch.input_ids)                           # [T]
        pos = torch.from_numpy(batch.positions).long()                    # [T]
        qidx = torch.from_numpy(batch.q_seq_idx).long()                   # [T]
        slots = torch.from_numpy(batch.slot_mapping).long()               # [T]
        tables = torch.from_numpy(batch.block_tables).long()              # [B, M]
        lens = torch.from_numpy(batch.seq_lens).long()                    # [B]
        kv = self.kv
        split = None
        if batch.kind == "decode" or self.batch_invariant:
            split = attention.split_size_for(self.policy.kind, self.policy.split_size, batch.seq_lens.tolist(),
                                             self.model.cfg.num_key_value_heads)

        theta = self.model.cfg.rope_theta if self.model.rope_in_attention else None

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kv.write(layer, slots, k, v)
            if self.batch_invariant:   # the same per-query computation in prefill and decode
                return attention.invariant_attention(q, kv.k[layer], kv.v[layer], tables, qidx, pos, split,
                                                     rope_theta=theta)
            if batch.kind == "prefill":
                return attention.paged_prefill(q, kv.k[layer], kv.v[layer], tables, lens, qidx, pos, rope_theta=theta)
            return attention.split_kv_decode(q, kv.k[layer], kv.v[layer], tables, lens, split, rope_theta=theta)

        hidden = self.model.forward(ids, pos, attend)                      # [T, H]
        rows = torch.from_numpy(batch.sample_rows)
        logits = self.model.logits(hidden[rows])                          # [S, V]
        positions = [int(batch.positions[r]) + 1 for r in batch.sample_rows]  # where the sampled tokens land
        toks, lps = sample_batch(logits, [s.params for s in batch.sample_seqs], positions)
        return StepResult(toks, lps, split if batch.kind == "decode" else None,
                          logits if self.record_logits else None)
