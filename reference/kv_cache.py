"""The paged KV cache and the block manager that hands out its pages."""

from __future__ import annotations

from collections import deque
from itertools import islice

import torch

from .errors import OutOfBlocksError


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens."""
    return (num_tokens + block_size - 1) // block_size


class BlockManager:
    """Physical page ids ``0 .. num_blocks-1`` with reference counts.

    A sequence owns a *block table* (a list of page ids, logical block ``j`` -> page
    ``table[j]``). ``grow`` appends only the delta a new length needs; ``share`` lets another
    table point at the same pages (group prefix sharing); ``free`` drops one reference to
    each page and returns a page to the pool when nobody holds it. A write into a page held by
    several tables first copies it (``copy_on_write``). Either a request succeeds whole or
    nothing changes.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref: list[int] = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_pages(self) -> list[int]:
        return list(self._free)

    def refcount(self, page: int) -> int:
        return self._ref[page]

    def delta(self, table: list[int], new_len: int) -> int:
        """Pages ``table`` must gain to hold ``new_len`` tokens."""
        return max(0, blocks_for(new_len, self.block_size) - len(table))

    def shared_in_range(self, table: list[int], start: int, end: int) -> int:
        """Pages of ``table`` covering token positions ``[start, end)`` that other tables share."""
        if end <= start:
            return 0
        first, last = start // self.block_size, min((end - 1) // self.block_size, len(table) - 1)
        return sum(1 for j in range(first, last + 1) if self._ref[table[j]] > 1)

    def peek(self, n: int) -> list[int]:
        """The pages the next ``n`` single-page requests would get, in that order (nothing changes)."""
        return list(islice(self._free, n))

    def can_grow(self, table: list[int], new_len: int) -> bool:
        return self.delta(table, new_len) <= len(self._free)

    def grow(self, table: list[int], new_len: int) -> list[int]:
        """Append to ``table`` (in place) the pages needed for ``new_len`` tokens; returns the new pages."""
        need = self.delta(table, new_len)
        if need > len(self._free):
            raise OutOfBlocksError(f"need {need} more blocks, {len(self._free)} free of {self.num_blocks}")
        new = [self._free.popleft() for _ in range(need)]
        for page in new:
            self._ref[page] = 1
        table.extend(new)
        return new

    def share(self, pages: list[int]) -> list[int]:
        """A new table holding the same pages (one more reference each)."""
        for page in pages:
            self._ref[page] += 1
        return list(pages)

    def copy_on_write(self, table: list[int], start: int, end: int) -> list[tuple[int, int]]:
        """Give ``table`` private copies of the shared pages covering ``[start, end)``.

        Returns the ``(source, destination)`` page copies the device must make before writing."""
        copies: list[tuple[int, int]] = []
        if end <= start:
            return copies
        for j in range(start // self.block_size, min((end - 1) // self.block_size, len(table) - 1) + 1):
            old = table[j]
            if self._ref[old] > 1:
                if not self._free:
                    raise OutOfBlocksError("no free page for a copy-on-write")
                new = self._free.popleft()
                self._ref[new] = 1
                self._ref[old] -= 1
                table[j] = new
                copies.append((old, new))
        return copies

    def free(self, table: list[int]) -> None:
        """Drop ``table``'s reference to each of its pages and empty it."""
        for page in table:
            self._ref[page] -= 1
            if self._ref[page] == 0:
                self._free.append(page)
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

    def copy_pages(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: page ``dst`` becomes a copy of page ``src`` in every layer."""
        for src, dst in copies:
            for layer in range(len(self.k)):
                self.k[layer][dst] = self.k[layer][src]
                self.v[layer][dst] = self.v[layer][src]

    def read_pages(self, pages: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of ``pages`` in every layer: ``[n, block_size, n_kv, D]`` each (swap out)."""
        idx = torch.tensor(pages, dtype=torch.long)
        return [k[idx].clone() for k in self.k], [v[idx].clone() for v in self.v]

    def write_pages(self, pages: list[int], k: list[torch.Tensor], v: list[torch.Tensor]) -> None:
        """Restore swapped-out pages into ``pages`` (swap in)."""
        idx = torch.tensor(pages, dtype=torch.long)
        for layer in range(len(self.k)):
            self.k[layer][idx] = k[layer]
            self.v[layer][idx] = v[layer]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v [T, n_kv, D]`` at flat slots ``page * block_size + offset`` (``slots [T]``, -1 skips)."""
        keep = slots >= 0
        s = slots[keep].long()
        self.k[layer][s // self.block_size, s % self.block_size] = k[keep].to(self.k[layer].dtype)
        self.v[layer][s // self.block_size, s % self.block_size] = v[keep].to(self.v[layer].dtype)
