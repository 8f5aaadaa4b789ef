"""``engine.kernels`` for the optimized engine: the CUDA attention kernels behind the same
launch guards and signatures as ``reference/kernels.py``.

Inputs may live anywhere; they are checked on the host, moved to the engine's GPU in bf16
(indices in int32) and the result comes back on that GPU (partial states in float32).
"""

from __future__ import annotations

import torch

from reference import attention
from reference.attention import PartialState

from . import ops


class OptimizedKernels:
    dtype = torch.bfloat16

    def __init__(self, device: torch.device) -> None:
        self.device = str(device)
        self._dev = device

    def _bf(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self._dev, dtype=torch.bfloat16).contiguous()

    def _i32(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self._dev, dtype=torch.int32).contiguous()

    def _guard(self, k_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
        attention.check_block_tables(block_tables.cpu(), seq_lens.cpu(), k_cache.shape[0], k_cache.shape[1])

    def paged_prefill(self, q, k_cache, v_cache, block_tables, seq_lens, q_seq_idx, q_pos, scale=None):
        self._guard(k_cache, block_tables, seq_lens)
        attention.check_query_positions(q_seq_idx.cpu(), q_pos.cpu(), seq_lens.cpu())
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return ops.paged_prefill(self._bf(q), self._bf(k_cache), self._bf(v_cache), self._i32(block_tables),
                                 self._i32(seq_lens), self._i32(q_seq_idx), self._i32(q_pos), scale)

    def split_kv_partials(self, q, k_cache, v_cache, block_tables, seq_lens, split_size, scale=None, max_splits=None):
        self._guard(k_cache, block_tables, seq_lens)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        split_size, max_splits = attention.check_splits(split_size, seq_lens, max_splits)
        return ops.split_kv_partials(self._bf(q), self._bf(k_cache), self._bf(v_cache), self._i32(block_tables),
                                     self._i32(seq_lens), split_size, scale, max_splits)

    def split_kv_decode(self, q, k_cache, v_cache, block_tables, seq_lens, split_size, scale=None):
        self._guard(k_cache, block_tables, seq_lens)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        size = split_size if split_size is not None else max([int(x) for x in seq_lens] + [1])
        size, max_splits = attention.check_splits(size, seq_lens)
        return ops.split_kv_decode(self._bf(q), self._bf(k_cache), self._bf(v_cache), self._i32(block_tables),
                                   self._i32(seq_lens), size, scale, max_splits=max_splits)

    def merge_states(self, states: list[PartialState]):
        order = attention.ordered_states(states)
        shape = order[0].lse.shape
        D = order[0].o.shape[-1]
        o = torch.stack([s.o.reshape(-1, D) for s in order]).to(self._dev, torch.float32).contiguous()   # [N, R, D]
        lse = torch.stack([s.lse.reshape(-1) for s in order]).to(self._dev, torch.float32).contiguous()  # [N, R]
        mo, ml = ops.merge_states(o, lse)
        return mo.view(*shape, D), ml.view(*shape)
