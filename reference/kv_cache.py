"""The paged KV cache and the block manager that hands out its pages."""

from __future__ import annotations

from collections import deque

import torch

from .errors import OutOfBlocksError


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens."""
    return (num_tokens + block_size - 1) // block_size


class BlockManager:
    """A free list of physical page ids ``0 .. num_blocks-1``.

    A sequence owns a *block table* (a list of page ids, logical block ``j`` -> page
    ``table[j]``). ``grow`` appends only the delta a new length needs; ``free`` returns every
    page. Either the whole request succeeds or nothing changes.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_pages(self) -> list[int]:
        return list(self._free)

    def delta(self, table: list[int], new_len: int) -> int:
        """Pages ``table`` must gain to hold ``new_len`` tokens."""
        return max(0, blocks_for(new_len, self.block_size) - len(table))

    def can_grow(self, table: list[int], new_len: int) -> bool:
        return self.delta(table, new_len) <= len(self._free)

    def grow(self, table: list[int], new_len: int) -> list[int]:
        """Append to ``table`` (in place) the pages needed for ``new_len`` tokens; returns the new pages."""
        need = self.delta(table, new_len)
        if need > len(self._free):
            raise OutOfBlocksError(f"need {need} more blocks, {len(self._free)} free of {self.num_blocks}")
        new = [self._free.popleft() for _ in range(need)]
        table.extend(new)
        return new

    def free(self, table: list[int]) -> None:
        """Return every page of ``table`` to the pool and empty it."""
        self._free.extend(table)
        table.clear()


class KVCache:
    """Per-layer key and value pages ``[num_blocks, block_size, n_kv, D]``.

    Fresh pages are filled with NaN: a read of a slot nothing wrote poisons the output, so a
    wrong block table or a missing mask cannot go unnoticed.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, n_kv: int, head_dim: int,
                 dtype: torch.dtype = torch.float32) -> None:
        shape = (num_blocks, block_size, n_kv, head_dim)
        self.k = [torch.full(shape, float("nan"), dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.full(shape, float("nan"), dtype=dtype) for _ in range(num_layers)]
        self.num_blocks = num_blocks
        self.block_size = block_size

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v [T, n_kv, D]`` at flat slots ``page * block_size + offset`` (``slots [T]``, -1 skips)."""
        keep = slots >= 0
        s = slots[keep].long()
        self.k[layer][s // self.block_size, s % self.block_size] = k[keep].to(self.k[layer].dtype)
        self.v[layer][s // self.block_size, s % self.block_size] = v[keep].to(self.v[layer].dtype)
