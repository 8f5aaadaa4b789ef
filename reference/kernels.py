"""``engine.kernels`` for the reference: the attention entry points behind the launch guards.

Both engines expose the same signatures, so the kernel-level clauses (SPLITK, PAGED) call
either one. Inputs are torch tensors; the reference computes on the CPU and returns tensors
of ``q``'s dtype (partial states in float32).
"""

from __future__ import annotations

import torch

from . import attention
from .attention import PartialState


class ReferenceKernels:
    device = "cpu"

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    @staticmethod
    def _guard(k_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
        attention.check_block_tables(block_tables, seq_lens, k_cache.shape[0], k_cache.shape[1])

    def paged_prefill(self, q, k_cache, v_cache, block_tables, seq_lens, q_seq_idx, q_pos, scale=None):
        self._guard(k_cache, block_tables, seq_lens)
        attention.check_query_positions(q_seq_idx, q_pos, seq_lens)
        return attention.paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, q_seq_idx, q_pos, scale)

    def split_kv_decode(self, q, k_cache, v_cache, block_tables, seq_lens, split_size, scale=None):
        self._guard(k_cache, block_tables, seq_lens)
        return attention.split_kv_decode(q, k_cache, v_cache, block_tables, seq_lens, split_size, scale)

    def split_kv_partials(self, q, k_cache, v_cache, block_tables, seq_lens, split_size, scale=None, max_splits=None):
        self._guard(k_cache, block_tables, seq_lens)
        return attention.split_kv_partials(q, k_cache, v_cache, block_tables, seq_lens, split_size, scale, max_splits)

    def merge_states(self, states: list[PartialState]):
        return attention.merge_states(states)
